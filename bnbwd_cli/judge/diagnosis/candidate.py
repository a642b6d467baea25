"""A hypothesis to test: the cause it names, what a kernel with that bug outputs, how to say it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name
from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Assessment, Prediction, blocks
from bnbwd_cli.judge.index_words import indices_text


@dataclass(frozen=True)
class Candidate:
    """``text`` turns the assessment (the shares explained) into the hint's one line."""

    cause: str
    prediction: Prediction
    text: Callable[[Assessment], str]
    channels: tuple[int, ...] = ()


def sixteen_bit_types(short: bool = False) -> tuple[tuple[str, np.dtype], ...]:
    """(name, dtype) of bfloat16 and float16 (ml_dtypes is loaded here, on first use, not with the judge)."""
    names = ("bf16", "f16") if short else ("bfloat16", "float16")
    return tuple(zip(names, (dtype_from_name("bf16"), np.dtype(np.float16))))


def percent(share: float) -> str:
    """A share as a percentage that never rounds up to 100%."""
    value = np.floor(share * 1000) / 10
    return f"{value:.1f}%"


def channel_list(channels: Sequence[int]) -> str:
    """Channels as ranges: "c=0..7, 12" (judge/where.py's words, everywhere a report names channels)."""
    return f"c={indices_text(channels)}"


def channel_line(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, diff_src's deviation d = a - r fitted as offset + slope*xhat (least squares); NaN where a
    channel has fewer than 3 finite elements (from the sums of the case's pass: build.DiffSrcSums)."""
    sums = case.shared["diff_src_sums"]
    n = sums.count
    with np.errstate(invalid="ignore", divide="ignore"):
        det = n * sums.xx - sums.x * sums.x
        slope = (n * sums.xd - sums.x * sums.d) / det
        offset = (sums.d - slope * sums.x) / n
    bad = (n < 3) | ~(np.abs(det) > 0)
    return np.where(bad, np.nan, offset), np.where(bad, np.nan, slope)


def channel_fit(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """channel_line's offset and slope, and the residual's rms (a pass of its own; computed once a case)."""
    return case.once("channel_fit", lambda: _channel_fit(case))


def _channel_fit(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = case.outputs["diff_src"]
    c = case.channels
    n = case.shared["diff_src_sums"].count
    offset, slope = channel_line(case)
    with np.errstate(invalid="ignore", divide="ignore"):
        squares = np.zeros(c)
        for rows in blocks(case.shape):  # (blocks: no whole-tensor temporaries)
            d = out.actual_at(rows) - out.reference_at(rows)
            x = case.xhat_at(rows)
            residual = np.where(np.isfinite(d) & np.isfinite(x) & out.kept(rows), d - offset[:, None] - slope[:, None] * x, 0.0)
            squares += np.einsum("ncs,ncs->c", residual, residual)
        rms = np.sqrt(squares / np.maximum(n - 2, 1))
    return offset, slope, np.where(np.isnan(offset), np.nan, rms)


def channel_ratio(case: Case) -> np.ndarray:
    """Per channel, the least-squares ratio <a, r> / <r, r> of diff_src (NaN where r is zero; from the sums of the
    case's pass: build.DiffSrcSums)."""
    sums = case.shared["diff_src_sums"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums.ar / sums.rr


def deviating_channels(case: Case, name: str) -> np.ndarray:
    """(C,) bool: channels of ``name`` with an element beyond K units of the reference."""
    beyond = case.outputs[name].beyond
    return beyond.any(axis=(0, 2)) if name == "diff_src" else beyond
