"""The screening sample: a fixed part of diff_src every hypothesis is first tested on (judge/diagnosis/assess.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.index_words import distinct

SAMPLE = 1 << 16  # diff_src elements of the first look
SCREEN_POSITIONS = 512  # (n, s) positions of the screening sample, in every channel (fewer when C is large)


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
    return distinct(np.concatenate([spread, hit]))  # (np.unique's plain form imports numpy.ma: index_words)


def screening_sample(case: Case) -> Sample:
    """The sample of diff_src's (N, C, S) view a hypothesis is screened on (see Sample; computed once a case; the
    run must hold diff_src)."""
    return case.once("sample", lambda: _screening_sample(case))


def _screening_sample(case: Case) -> Sample:
    out = case.outputs["diff_src"]
    n, channels, s = case.shape
    failing = out.beyond.any(axis=1).reshape(-1)
    flat = _sample_positions(n, s, channels, failing)
    rows = ((flat // s).reshape(1, 1, -1), np.arange(channels).reshape(1, -1, 1), (flat % s).reshape(1, 1, -1))
    return Sample(rows, out.actual_at(rows), out.reference_at(rows), case.scale_at(rows))
