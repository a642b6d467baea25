"""The batch's samples reduced in groups: diff_src from the sums over each group of samples alone, divided by that
group's own count (a data-parallel batch norm without its all-reduce, SyncBatchNorm's backward run per device).

The groups are the N samples split into G contiguous equal parts (every divisor G >= 2 of N). The per-sample sums of
dy and dy*xhat are one pass over the data (shared by every G); each hypothesis is then a function of an index, so the
screening sample rejects the wrong ones before anything is computed in full. The sums written stay the whole
batch's (the weight gradients are all-reduced) or are left to the run: a written sum is predicted as given.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bnbwd_cli.judge.diagnosis.candidate import Candidate, percent
from bnbwd_cli.judge.diagnosis.case import Case, Prediction

MAX_GROUPS = 64  # group counts tried, at most (the divisors of N up to it)


def _rows_per_sample(case: Case) -> int:
    """Rows of the (N, C, S) view a sample spans: 1 for NCX, its positions for NXC (whose view is (M, C, 1))."""
    return case.shape[0] // case.inputs.src.shape[0]


def _per_sample_sums(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(N, C) sums of dy and of dy*xhat over each sample's positions (computed once a case, chunk by chunk)."""
    def compute():
        n, c = case.inputs.src.shape[0], case.channels
        per = _rows_per_sample(case)
        beta, gamma = np.zeros((n, c)), np.zeros((n, c))
        step = max(1, (1 << 18) // max(1, per * c * case.shape[2]))
        for start in range(0, n, step):
            stop = min(n, start + step)
            rows = (slice(start * per, stop * per), slice(None), slice(None))
            dy = case.dy_at(rows).reshape(stop - start, per, c, -1)
            beta[start:stop] = dy.sum(axis=(1, 3))
            gamma[start:stop] = np.einsum("npcs,npcs->nc", dy, case.xhat_at(rows).reshape(dy.shape))
        return beta, gamma
    return case.once("per-sample sums", compute)


def candidates(case: Case) -> Iterator[Candidate]:
    src = case.outputs.get("diff_src")
    n = case.inputs.src.shape[0]
    if src is None or not src.failed or not case.inputs.training or n < 2:
        return
    if any(case.outputs[name].suspicious for name in ("diff_beta", "diff_gamma") if name in case.outputs):
        return  # the hypothesis writes the whole batch's sums: a run whose sums are off is not one (spares the pass)
    facts, u = case.facts, case.unit
    beta_n, gamma_n = _per_sample_sums(case)
    positions = case.count // n
    per = _rows_per_sample(case)
    for groups in [g for g in range(2, min(n, MAX_GROUPS) + 1) if n % g == 0]:
        size = n // groups
        group_of = np.arange(n) // size
        beta_g = np.add.reduceat(beta_n, np.arange(0, n, size), axis=0)[group_of]  # (N, C): each sample's group's
        gamma_g = np.add.reduceat(gamma_n, np.arange(0, n, size), axis=0)[group_of]
        count = float(size * positions)

        def diff_src(rows, beta_g=beta_g, gamma_g=gamma_g, count=count):
            k = facts.scale[None, :, None]
            dy, xhat = case.dy_at(rows), case.xhat_at(rows)
            b, g = _at(beta_g, rows, per), _at(gamma_g, rows, per)
            value = k * (dy - b / count - xhat * g / count)
            noise = np.abs(k) * (u * np.abs(dy) + u * (np.abs(b) + np.abs(g * xhat)) / count * np.sqrt(count))
            return value, noise

        words = (f"diff_src used the sums of each group of {size} sample{'s' if size > 1 else ''} alone ({groups} "
                 f"groups: n=0..{size - 1}, n={size}..{2 * size - 1}, ...), divided by the group's own count "
                 f"{int(count)} instead of M = {case.count}: a data-parallel batch norm without its all-reduce "
                 "(SyncBatchNorm)?") if size > 1 else (
                 f"diff_src used each sample's own sums (divided by its {positions} positions instead of "
                 f"M = {case.count}): per-sample statistics, as instance normalization computes them")
        yield Candidate("sample-group-sums", Prediction(diff_src),
                        lambda s, words=words: f"{words}; recomputed that way: explains {percent(s.share)} of the "
                                               "deviation")


def _at(per_sample: np.ndarray, rows: tuple, per: int) -> np.ndarray:
    """(N, C) per-sample values at an index of the (N, C, S) view (``per`` of its rows a sample): a range of rows
    (slices) or the screening sample's (1, 1, P) rows and (1, C, 1) channels; broadcastable to what it selects."""
    first, second = rows[0], rows[1]
    if isinstance(first, slice):
        samples = np.arange(per_sample.shape[0] * per)[first] // per
        return per_sample[samples][:, second][..., None]
    return per_sample[first // per, second]  # (1, C, P)
