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

from bnbwd_cli.dtypes import SMALLEST_NORMAL, dtype_from_name, to_float64, ulp_spacing
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
    # elements the judge let pass as subnormal results flushed to zero (Judging.ftz): left out of every test and fit
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
    def deviation_norm(self) -> float:
        """||a - r|| over the elements the share is measured on (see share_explained)."""
        return _norm_off(self, self.reference)

    def where(self, values: np.ndarray) -> np.ndarray:
        """The elements a share is measured on: those beyond K units when there are any, else all."""
        if self.beyond is not None and self.beyond.any():
            return values[self.beyond]
        return values


def _norm_off(out: Output, p: np.ndarray, dtype: str | None = None) -> float:
    """||a - p|| over the elements a share is measured on (Output.where), p rounded to ``dtype`` first (None: as
    it is); chunk by chunk along the first axis (case.chunks), the rounding and differences element for element."""
    some = out.beyond is not None and bool(out.beyond.any())
    squares = 0.0
    for part in chunks(out.actual.shape):
        a, q = out.actual[part], p[part]
        if some:
            a, q = a[out.beyond[part]], q[out.beyond[part]]
        if dtype is not None:
            q = rounded(q, dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            d = (a - q).reshape(-1)
        d = np.where(np.isfinite(d), d, 0.0)
        squares += float(np.dot(d, d))
    return math.sqrt(squares)


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

    @cached_property
    def sample(self) -> Sample:
        """diff_src's screening sample (the run must hold diff_src)."""
        return screening_sample(self.outputs["diff_src"], self.src_scale)

    @property
    def channels(self) -> int:
        return self.x.shape[1]

    @property
    def suspicious(self) -> tuple[str, ...]:
        return tuple(name for name, out in self.outputs.items() if out.suspicious)

    def sum_scale(self, name: str) -> np.ndarray:
        s_beta, s_gamma = self.facts.sum_scales(self.unit)
        return s_gamma if name == "diff_gamma" else s_beta


CHUNK = 1 << 18  # elements of the (N, C, S) view a whole-tensor step works on at a time (its temporaries stay in cache)


def chunks(shape: tuple[int, ...]) -> list[slice]:
    """Slices of the first axis of an (N, C, S) view, about CHUNK elements each. A step done chunk by chunk
    computes the same numbers element for element as on the whole; it only spares the large temporaries
    (each a fresh allocation's page faults and a trip through memory)."""
    per = max(1, CHUNK // max(1, math.prod(shape[1:])))
    return [slice(start, start + per) for start in range(0, shape[0], per)]


def _float64(array: np.ndarray, parts: list[slice]) -> np.ndarray:
    """to_float64 of an (N, C, S) view, converted chunk by chunk (float64 stays a view)."""
    if array.dtype == np.float64:
        return to_float64(array)
    out = np.empty(array.shape)
    for part in parts:
        to_float64(array[part], out=out[part])
    return out


def _flushed(a: np.ndarray, r: np.ndarray, comparison: Comparison) -> np.ndarray | None:
    """The elements the judge let pass as subnormal results flushed to zero: a == 0 where 0 < |r| < the smallest
    normal of the output's dtype (judge/rules.pass_flushed); None when there are none."""
    below = SMALLEST_NORMAL.get(comparison.dtype, 0.0)
    flushed = np.zeros(a.shape, bool)
    for part in chunks(a.shape) if a.ndim == 3 else [slice(None)]:
        reference = np.abs(r[part])
        flushed[part] = (a[part] == 0) & (reference > 0) & (reference < below)
    return flushed if flushed.any() else None


def build_case(inputs: Op, facts: ChannelFacts, outputs: Mapping[str, tuple[np.ndarray, np.ndarray, Comparison]]) -> Case:
    """float64 views of the inputs and outputs; ``outputs``: name -> (actual, reference, comparison)."""
    fmt = inputs.data_format
    parts = chunks(view3(inputs.src, fmt).shape)
    x, dy = (_float64(view3(a, fmt), parts) for a in (inputs.src, inputs.diff_dst))
    xhat = np.empty(x.shape)
    mean, invstd = facts.mean[:, None], facts.invstd[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        for part in parts:
            np.multiply(np.subtract(x[part], mean, out=xhat[part]), invstd, out=xhat[part])
    gamma = np.ones_like(facts.mean) if inputs.gamma is None else to_float64(inputs.gamma)
    first = outputs.get("diff_src", next(iter(outputs.values())))[2]
    unit, max_units = first.scaled.unit, first.scaled.max_units
    scale = None
    s_beta, s_gamma = facts.sum_scales(unit)
    observed = {}
    for name, (a, r, comparison) in outputs.items():
        if name == "diff_src":
            a, r = _float64(view3(a, fmt), parts), _float64(view3(r, fmt), parts)
            model = diff_src_scale(facts, unit, inputs.training)
            scale, beyond = np.empty(a.shape), np.empty(a.shape, bool)
            with np.errstate(invalid="ignore", over="ignore"):
                for part in parts:
                    scale[part] = model.block(xhat[part], dy[part], r[part], slice(0, x.shape[1]))
                    beyond[part] = ~(np.abs(a[part] - r[part]) <= comparison.scaled.max_units * scale[part]
                                     + ulp_spacing(r[part], comparison.dtype))
        else:
            a, r = to_float64(a).reshape(-1), to_float64(r).reshape(-1)
            s = s_gamma if name == "diff_gamma" else s_beta
            with np.errstate(invalid="ignore", over="ignore"):
                beyond = ~(np.abs(a - r) <= comparison.scaled.max_units * s + ulp_spacing(r, comparison.dtype))
        flushed = _flushed(a, r, comparison) if comparison.flushed else None
        if flushed is not None:
            beyond &= ~flushed
        observed[name] = Output(a, r, comparison, beyond, flushed)
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

    def resolve_in_chunks(self, shape: tuple[int, ...]) -> None:
        """Compute a diff_src given as a function chunk by chunk (case.chunks) into whole (N, C, S) arrays: the
        same numbers as one call on the whole view, without its large temporaries."""
        if "diff_src" in self._computed or not callable(self.diff_src):
            return
        values = noise = None
        for part in chunks(shape):
            p, n = self.diff_src((part, slice(None), slice(None)))
            if values is None:
                values = np.empty(shape)
                noise = None if n is None else np.empty(shape)
            values[part] = p
            if noise is not None:
                noise[part] = n
        self._computed["diff_src"], self._computed["noise"] = values, noise

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


def _tolerance(case: Case, name: str, p: np.ndarray, r: np.ndarray, extra: np.ndarray | None,
               base: np.ndarray | None = None) -> np.ndarray:
    """K units of the prediction's noise plus one ulp of p; ``base``: the correct kernel's scale where p lies
    (default: the whole output's)."""
    out = case.outputs[name]
    if base is None:
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
    if name != "diff_src":
        with np.errstate(invalid="ignore", over="ignore"):
            beyond = ~(np.abs(out.actual - p) <= _tolerance(case, name, p, out.reference, extra)) & out.kept()
        return int(np.count_nonzero(beyond)) <= out.comparison.allowed_mismatches
    count = 0
    elementwise = extra is not None and np.shape(extra) == p.shape
    for part in chunks(p.shape):
        with np.errstate(invalid="ignore", over="ignore"):
            tolerance = _tolerance(case, name, p[part], out.reference[part], extra[part] if elementwise else extra,
                                   case.src_scale[part])
            count += int(np.count_nonzero(~(np.abs(out.actual[part] - p[part]) <= tolerance) & out.kept(part)))
        if count > out.comparison.allowed_mismatches:
            return False
    return True


def on_sample(case: Case, prediction: Prediction) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The prediction's diff_src and its noise on the screening sample (computed there only when the prediction is
    a function of an index), or None when its noise has no element-wise form to take the sample of."""
    rows = case.sample.rows
    if callable(prediction.diff_src) and "diff_src" not in prediction._computed:
        return prediction.diff_src(rows)
    p, extra = prediction.of("diff_src"), prediction.noise("diff_src")
    if extra is not None:
        if np.shape(extra) != p.shape:
            return None
        extra = extra[rows]
    return p[rows], extra


def screened(case: Case, prediction: Prediction) -> bool:
    """The first look at diff_src: False when the prediction misses the actual output beyond K units at more
    elements of the screening sample than the judge allows in the whole output. The sample is part of the whole
    and its numbers are the whole's (the same formulas element for element; the tolerance widened by
    SCREEN_SLACK), so what this rejects ``within`` would reject too: only the survivors are computed in full."""
    out = case.outputs.get("diff_src")
    if out is None or prediction.diff_src is None:
        return True
    found = on_sample(case, prediction)
    if found is None:
        return True
    p, extra = found
    sample = case.sample
    with np.errstate(invalid="ignore", over="ignore"):
        tolerance = _tolerance(case, "diff_src", p, sample.reference, extra, sample.scale) * (1 + SCREEN_SLACK)
        beyond = ~(np.abs(sample.actual - p) <= tolerance) & out.kept(sample.rows)
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
    before = out.deviation_norm
    after = _norm_off(out, p, out.comparison.dtype)
    return 1.0 - after / before if before > 0 else 0.0


def _bias_left(case: Case, name: str, p: np.ndarray):
    """The systematic deviation of actual from ``p`` (judge/bias.py's fit and threshold), or None."""
    out = case.outputs[name]
    # d = a - p against the reference's basis, p rounded to the output's grid as a and r are (else every
    # element carries p's distance to the grid, noise that a - r does not have)
    shifted = out.actual - rounded(p, out.comparison.dtype) + out.reference
    if out.flushed is not None:  # a flushed subnormal passed: no deviation there
        shifted = np.where(out.flushed, out.reference, shifted)
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
SCREEN_POSITIONS = 512  # (n, s) positions of the screening sample, in every channel (fewer when C is large)
SCREEN_SLACK = 1e-6  # the sample's tolerance widened by this (relative): the screen never rejects what the whole accepts


@dataclass(frozen=True)
class Sample:
    """A fixed, deterministic sample of diff_src's (N, C, S) view: every channel at P positions (n, s), half of
    them where the judge found failing elements (evenly over their positions in storage order), half evenly
    spaced over all positions (a stride coprime to common periods, so a pattern every k-th element is not
    missed or hit everywhere). ``rows`` indexes any (N, C, S) array to its (1, C, P) sample, so per-channel
    (C, 1) coefficients broadcast as on the whole view: a hypothesis computes its diff_src on ``rows`` exactly
    as on the whole (the same numbers element for element)."""

    rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    actual: np.ndarray
    reference: np.ndarray
    scale: np.ndarray  # diff_src's error scale of a correct kernel there

    @property
    def size(self) -> int:
        return self.actual.size


def _sample_positions(n: int, s: int, channels: int, failing: np.ndarray | None) -> np.ndarray:
    """Flat positions n*S + s of the screening sample (sorted, distinct)."""
    total = n * s
    count = min(SCREEN_POSITIONS, max(16, SAMPLE // max(channels, 1)))
    if count >= total:
        return np.arange(total)
    spread = (np.arange(count // 2, dtype=np.int64) * 7919 + total // 3) % total  # 7919: a prime
    where = np.flatnonzero(failing) if failing is not None else np.zeros(0, np.int64)
    if where.size == 0:
        where = np.arange(total)
    hit = where[np.linspace(0, where.size - 1, count - count // 2).astype(np.int64)]
    return np.unique(np.concatenate([spread, hit]))


def screening_sample(out: Output, scale: np.ndarray) -> Sample:
    """The sample of diff_src's (N, C, S) view a hypothesis is screened on (see Sample)."""
    n, channels, s = out.actual.shape
    failing = out.beyond.any(axis=1).reshape(-1) if out.beyond is not None else None
    flat = _sample_positions(n, s, channels, failing)
    rows = ((flat // s).reshape(1, 1, -1), np.arange(channels).reshape(1, -1, 1), (flat % s).reshape(1, 1, -1))
    return Sample(rows, out.actual[rows], out.reference[rows], scale[rows])


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
        if name == "diff_src" and not screened(case, prediction):
            return None
        if name == "diff_src" and out.failed and prediction.diff_src is not None and not _sample_agrees(out, prediction):
            return None
        if name == "diff_src" and prediction.diff_src is not None:
            prediction.resolve_in_chunks(out.actual.shape)
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
