"""What a diagnosis works on: the run under diagnosis, read where and when a test needs it.

``Case`` holds the op's inputs and each judged output as the kernel and bnbwd gave them (diff_src and the inputs as
(N, C, S) views, any float dtype), the per-channel facts, and what one pass over diff_src, block by block, found: which
elements are beyond K units of the reference (``Output.beyond``) and the deviation's norm (judge/diagnosis/build.py's
``build_case`` makes that pass and the case). A test reads float64 values where it needs them: ``Case.x_at``/``dy_at``/``xhat_at``/``scale_at`` and ``Output.actual_at``/``reference_at``
upcast (and for xhat and the error scale compute) any rows of the view, the same numbers element for element as
the whole tensors (float32 and float16 widen exactly; xhat and the scale are element-wise formulas). The whole
float64 tensors (``Case.x``, ``Output.actual``...) are formed only when a family asks for them: a failing run's
diagnosis mostly tests its hypotheses on a sample and the sums, and confirms one on the whole run block by block (prediction.blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge.comparison import Comparison
from bnbwd_cli.judge.diagnosis.prediction import Assessment, Prediction, blocks, chunks
from bnbwd_cli.judge.model import ChannelFacts, DiffSrcScale

if TYPE_CHECKING:
    from bnbwd_cli.core import Op

# what a family module needs besides the case, importable from here as before the split (prediction.py holds them)
__all__ = ["Assessment", "Case", "Output", "Prediction", "chunks"]

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
