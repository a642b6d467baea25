"""The outputs of a batch-norm backward computed with some of its ingredients changed (float64).

A hypothesis names what a buggy kernel used instead of the true ingredients (other statistics, another
gamma, sums over part of the channel, a permuted diff_dst...); ``backward_with`` computes what such a
kernel would output, before its own rounding, for the outputs the run holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnbwd_cli.judge.diagnosis.case import Case
from bnbwd_cli.judge.diagnosis.prediction import Lean, Prediction


@dataclass(frozen=True)
class Ingredients:
    """What the kernel used; None: the true value. Per-channel arrays are (C,); x and dy are (N, C, S).
    ``beta``/``gamma_sum``: the sums the kernel computed, used in diff_src and written (None: computed from
    the other ingredients); ``written_gamma``: a diff_gamma written other than the one diff_src used;
    ``divisor``: what the sums were divided by (None: M); ``subtract_mean``: (C,) bool, channels whose
    diff_src subtracts diff_beta/M."""

    mean: np.ndarray | None = None
    invstd: np.ndarray | None = None
    gamma: np.ndarray | None = None
    x: np.ndarray | None = None
    dy: np.ndarray | None = None
    beta: np.ndarray | None = None
    gamma_sum: np.ndarray | None = None
    written_gamma: np.ndarray | None = None
    divisor: float | None = None
    subtract_mean: np.ndarray | None = None
    inference: bool = False


def pick(value, default):
    return default if value is None else value


def backward_with(case: Case, used: Ingredients) -> Prediction:
    """diff_src, diff_gamma and diff_beta of a kernel that used ``used`` (only the outputs the run holds);
    diff_src is computed on first use."""
    facts = case.facts
    mean, invstd = pick(used.mean, facts.mean), pick(used.invstd, facts.invstd)
    # the kernel's x and dy at rows of the view: the case's (read there, not held whole) or the ones it used
    x_at = case.x_at if used.x is None else used.x.__getitem__
    dy_at = case.dy_at if used.dy is None else used.dy.__getitem__
    same_xhat = used.mean is None and used.invstd is None and used.x is None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if used.beta is not None:
            beta = used.beta
        else:
            beta = facts.diff_beta if used.dy is None else used.dy.sum(axis=(0, 2))
        if used.gamma_sum is not None:
            gamma_sum = used.gamma_sum
        elif same_xhat and used.dy is None:
            gamma_sum = facts.diff_gamma
        elif used.x is None and used.dy is None:  # other statistics: sum dy*(x - m')*i' in closed form
            gamma_sum = invstd * (facts.diff_gamma / facts.invstd + (facts.mean - mean) * facts.diff_beta)
        else:
            x, dy = pick(used.x, case.x), pick(used.dy, case.dy)
            gamma_sum = np.einsum("ncs,ncs->c", dy, (x - mean[:, None]) * invstd[:, None])

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        coefficients = _coefficients(case, used, _Sums(beta, gamma_sum, invstd))

    def ingredients(rows: tuple) -> tuple[np.ndarray, np.ndarray]:
        xhat = case.xhat_at(rows) if same_xhat else (x_at(rows) - mean[:, None]) * invstd[:, None]
        return xhat, dy_at(rows)

    def diff_src(rows: tuple) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            xhat, dy = ingredients(rows)
            return _diff_src(coefficients, xhat, dy), _noise(coefficients, case.unit, xhat, dy)

    # lean: the same numbers from src and diff_dst as stored where they widen exactly (case.operand): no upcast passes
    x_operand = case.src_operand if used.x is None else used.x.__getitem__
    dy_operand = case.dy_operand if used.dy is None else used.dy.__getitem__

    def lean_at(rows: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # (the caller's errstate)
        xhat = case.xhat_at(rows) if same_xhat else (x_operand(rows) - mean[:, None]) * invstd[:, None]
        dy = dy_operand(rows)
        return _diff_src(coefficients, xhat, dy), xhat, dy

    held = "diff_src" in case.outputs
    lean = None
    if held and _noise_never_nan(coefficients, case.unit):
        lean = Lean(lean_at, lambda channel, xhat, dy: _noise_at(coefficients, case.unit, channel, xhat, dy),
                    same_xhat, used.dy is None)
    return Prediction(
        diff_src=diff_src if held else None,
        diff_gamma=pick(used.written_gamma, gamma_sum) if "diff_gamma" in case.outputs else None,
        diff_beta=beta if "diff_beta" in case.outputs else None,
        lean=lean,
    )


@dataclass(frozen=True)
class _Sums:
    beta: np.ndarray
    gamma_sum: np.ndarray
    invstd: np.ndarray


@dataclass(frozen=True)
class _Coefficients:
    """The (C, 1) coefficients of diff_src = k*(dy - mean_dy - xhat*mean_g) and of its noise
    |k|*(u*|dy| + beta_noise + |xhat|*gamma_noise) (inference: mean_dy None, k*dy and |k|*u*|dy|)."""

    k: np.ndarray
    mean_dy: np.ndarray | None = None
    mean_g: np.ndarray | None = None
    beta_noise: np.ndarray | None = None
    gamma_noise: np.ndarray | None = None


def _coefficients(case: Case, used: Ingredients, sums: _Sums) -> _Coefficients:
    """diff_src's per-channel coefficients (formed once a hypothesis, not once a block): the error model's
    (judge/model.py) for this computation, its sums' errors divided by what it divides them by."""
    facts, u = case.facts, case.unit
    k = (pick(used.gamma, case.gamma) * sums.invstd)[:, None]
    if used.inference or not case.inputs.training:
        return _Coefficients(k)
    divisor = pick(used.divisor, float(max(case.count, 1)))
    mean_dy = sums.beta / divisor
    if used.subtract_mean is not None:
        mean_dy = np.where(used.subtract_mean, mean_dy, 0.0)
    s_beta, s_gamma = facts.sum_scales(u)
    s_gamma = s_gamma * np.abs(sums.invstd / facts.invstd)
    return _Coefficients(k, mean_dy[:, None], (sums.gamma_sum / divisor)[:, None],
                         ((u * np.abs(sums.beta) + s_beta) / divisor)[:, None],
                         ((u * np.abs(sums.gamma_sum) + s_gamma) / divisor)[:, None])


def _diff_src(coefficients: _Coefficients, xhat: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """diff_src at some rows: the coefficients' formula, element by element."""
    k = coefficients.k
    if coefficients.mean_dy is None:
        return k * dy
    return k * (dy - coefficients.mean_dy - xhat * coefficients.mean_g)


def _noise(coefficients: _Coefficients, u: float, xhat: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """diff_src's error scale at some rows: the coefficients' formula, element by element."""
    k = coefficients.k
    if coefficients.mean_dy is None:
        return np.abs(k) * u * np.abs(dy)
    return np.abs(k) * (u * np.abs(dy) + coefficients.beta_noise + np.abs(xhat) * coefficients.gamma_noise)


def _noise_at(coefficients: _Coefficients, u: float, channel: np.ndarray, xhat: np.ndarray,
              dy: np.ndarray) -> np.ndarray:
    """_noise at scattered elements (flat arrays of each one's channel, xhat and dy): the same operations on the
    same operands, each element's channel coefficients gathered (the numbers _noise gives there)."""
    def at(coefficient: np.ndarray) -> np.ndarray:
        return coefficient.reshape(-1)[channel]

    with np.errstate(invalid="ignore", over="ignore"):
        if coefficients.mean_dy is None:
            return at(np.abs(coefficients.k) * u) * np.abs(dy)
        return np.abs(at(coefficients.k)) * (u * np.abs(dy) + at(coefficients.beta_noise)
                                             + np.abs(xhat) * at(coefficients.gamma_noise))


def _noise_never_nan(coefficients: _Coefficients, u: float) -> bool:
    """Is the noise a number wherever diff_src is (its NaN only where dy or xhat is NaN, which makes diff_src NaN
    too)? Finite coefficients, a factor |k| (|k|*u) > 0 and a gamma term > 0 (so an infinite dy or xhat makes it
    inf, never 0*inf), a beta term >= 0 (no inf - inf): then Prediction.lean may leave it unformed where the test
    needs no noise (whole_run.confirmed)."""
    k = np.abs(coefficients.k)
    with np.errstate(invalid="ignore", over="ignore"):
        if coefficients.mean_dy is None:
            factor = k * u
            return bool(np.all(np.isfinite(factor) & (factor > 0)))
        beta, gamma = coefficients.beta_noise, coefficients.gamma_noise
        return bool(np.all(np.isfinite(k) & (k > 0) & np.isfinite(beta) & (beta >= 0) & np.isfinite(gamma)
                           & (gamma > 0)))
