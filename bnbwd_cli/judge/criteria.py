"""What decided an output: each criterion it was held to, its statistic against its threshold, decided here.

One rule, decided once (Comparison.criteria) and shown the same way by the text report, --brief, `check`'s
lines, the JSON document and the API: an output fails when any of its criteria fails. render/ shows these
values and decides nothing (tests/test_render_decides_nothing.py). Pure: no rich, no comparison modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Criterion:
    """One criterion an output is held to. ``statistic``: "nonfinite" (NaN/Inf where the other side differs, against
    none: it fails whatever the allowance, and comes first), "max_units" (its worst element, in units of the error
    scale, against K), "mismatches" (failing elements against those allowed), "rel_l2" (the fixed rule's norm test)
    or "systematic_scale" (|scale| of actual vs reference, overall or in ``channel``, against its threshold).
    ``beyond``: the statistic is beyond its threshold (what a report shows as ">"; the worst element may be beyond
    K yet pass within its one ulp of rounding). ``checked``: False for a systematic scale reported under
    --no-bias-check (it decides nothing). ``passed``: this criterion's verdict."""

    statistic: str
    value: float
    threshold: float
    passed: bool
    beyond: bool
    channel: int | None = None
    checked: bool = True


def criteria_of(c: Any) -> tuple[Criterion, ...]:
    """The criteria that decide ``c`` (a judge/comparison.Comparison: not imported, it imports this module), in the
    order a report states them."""
    criteria = []
    nonfinite = c.nonfinite.mismatches
    if nonfinite:  # NaN/Inf first: they fail whatever the allowance, and the units below are the finite elements'
        criteria.append(Criterion("nonfinite", float(nonfinite), 0.0, False, True))
    elements_ok = c.mismatches - nonfinite <= c.allowed_mismatches
    if c.scaled is not None and c.allowed_mismatches == 0 and c.max_units is not None:
        criteria.append(_beside("max_units", c.max_units.value, c.scaled.max_units, elements_ok))
    else:
        criteria.append(Criterion("mismatches", float(c.mismatches - nonfinite), float(c.allowed_mismatches),
                                  elements_ok, not elements_ok))
    if c.tolerance is not None:
        criteria.append(_beside("rel_l2", c.rel_l2, c.tolerance.rel_l2, c.rel_l2_passed))
    if c.bias is not None:
        channel, scale, threshold = c.bias.decisive()
        checked = c.scaled is not None and c.scaled.bias_check
        beyond = abs(scale) > threshold
        criteria.append(Criterion("systematic_scale", scale, threshold, not (checked and beyond), beyond, channel,
                                  checked))
    return tuple(criteria)


def _beside(statistic: str, value: float, threshold: float, passed: bool) -> Criterion:
    return Criterion(statistic, value, threshold, passed, abs(value) > threshold)


def deciding(criteria: tuple[Criterion, ...]) -> Criterion:
    """The criterion that decided: the first one failed, else the first (the elements')."""
    return next((t for t in criteria if not t.passed), criteria[0])
