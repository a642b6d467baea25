"""A hypothesis' outputs (``Prediction``) and what testing it found (``Assessment``).

A prediction's diff_src is usually a function of an index into the (N, C, S) view: most hypotheses are rejected on
the sums alone or on the screening sample, so diff_src is computed on the sample first, then block by block on the
whole run for the few that survive (judge/diagnosis/assess.py), and held whole only where a test needs it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from bnbwd_cli.layout import PER_CHANNEL_RUN


def chunks(shape: tuple[int, ...], size: int | None = None) -> list[slice]:
    """Slices of the first axis of an (N, C, S) view, about CHUNK elements each. A step done chunk by chunk
    computes the same numbers element for element as on the whole; it only spares the large temporaries
    (each a fresh allocation's page faults and a trip through memory)."""
    per = max(1, (CHUNK if size is None else size) // max(1, int(np.prod(shape[1:]))))
    return [slice(start, start + per) for start in range(0, shape[0], per)]


CHUNK = 1 << 18  # elements of the (N, C, S) view a whole-tensor step works on at a time (its temporaries stay in cache)
# Elements of the (N, C, S) view a walk over the whole run (the case's pass, a hypothesis' confirmation) works on at a
# time: its float64 temporaries (64 KiB) stay in the CPU's cache and below malloc's threshold for fresh pages from
# the kernel (128 KiB): about 8x less CPU than 2^18-element chunks (bench/RESULTS.md).
BLOCK = 1 << 13


def blocks(shape: tuple[int, int, int], size: int = BLOCK) -> list[tuple[slice, slice, slice]]:
    """Rows (n, all channels, s) of an (N, C, S) view, about ``size`` elements each: whole samples when one holds
    fewer, else runs of positions of one sample. Every block holds every channel, so (C, 1) coefficients
    broadcast as on the whole view; runs stay shorter than layout.PER_CHANNEL_RUN (one call an operation)."""
    n, c, s = shape
    if c * s <= size:
        per = max(1, size // max(c * s, 1))
        return [(slice(i, i + per), slice(None), slice(None)) for i in range(0, n, per)]
    width = max(1, min(size // max(c, 1), PER_CHANNEL_RUN - 1))
    return [(slice(i, i + 1), slice(None), slice(j, j + width)) for i in range(n) for j in range(0, s, width)]


@dataclass(frozen=True)
class Lean:
    """A hypothesis' diff_src for a test that needs its error scale (noise) at few elements (whole_run.confirmed):
    ``at(rows)``: diff_src at a block's rows and the xhat and dy it was computed from there (dy possibly as stored,
    float16/float32: case.operand); ``noise(channel, xhat,
    dy)``: the noise at scattered elements from their channels, xhat and dy (the numbers the whole formula gives
    them). ``case_xhat``/``case_dy``: whether that xhat/dy is the case's own (Case.xhat_at/dy_at's numbers)."""

    at: Callable[[tuple], tuple[np.ndarray, np.ndarray, np.ndarray]]
    noise: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    case_xhat: bool
    case_dy: bool


@dataclass(frozen=True)
class Prediction:
    """A hypothesis' outputs (float64; None: as the reference). ``sum_scales``: per output, the error scale of
    a kernel computing that way where it exceeds a correct kernel's (e.g. sums of dy*x instead of dy*xhat,
    diff_src from sums not divided by M); the larger of the two applies. ``diff_src`` may be a function
    of an index into the (N, C, S) view returning (diff_src, its error scale) there. ``lean`` (optional, with such a
    function): the same diff_src at rows of blocks, and its error scale at scattered elements, for a test that needs
    the scale at few elements (whole_run.confirmed); offered only where that scale is a number wherever diff_src is
    (the scale's NaN only where diff_src's)."""

    diff_src: np.ndarray | Callable[[tuple], tuple[np.ndarray, np.ndarray | None]] | None = None
    diff_gamma: np.ndarray | None = None
    diff_beta: np.ndarray | None = None
    sum_scales: Mapping[str, np.ndarray] = field(default_factory=dict)
    lean: Lean | None = None
    _computed: dict = field(default_factory=dict, compare=False, repr=False)

    def _resolve(self) -> None:
        if "diff_src" not in self._computed:
            if callable(self.diff_src):
                self._computed["diff_src"], self._computed["noise"] = self.diff_src((slice(None),) * 3)
            else:
                self._computed["diff_src"], self._computed["noise"] = self.diff_src, self.sum_scales.get("diff_src")

    def resolve_in_chunks(self, shape: tuple[int, ...]) -> None:
        """Compute a diff_src given as a function chunk by chunk (chunks) into whole (N, C, S) arrays: the same
        numbers as one call on the whole view, without its large temporaries (for the tests that need it whole)."""
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

    def rows(self, rows: tuple) -> tuple[np.ndarray, np.ndarray | None]:
        """diff_src and its noise at ``rows`` of the (N, C, S) view (slices or an index), computed there only when
        diff_src is a function and not yet held whole; the noise None when it has no element-wise form (a (C,)
        scale or none: the caller applies it as it is)."""
        if callable(self.diff_src) and "diff_src" not in self._computed:
            return self.diff_src(rows)
        p, extra = self.of("diff_src"), self.noise("diff_src")
        if extra is not None and np.shape(extra) == np.shape(p):
            extra = extra[rows]
        return p[rows], extra

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
