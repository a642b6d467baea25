"""What decided an output: each criterion it was held to, as one statistic against its threshold.

One rule, shown the same way by the text report, --brief, `check`'s lines and the JSON document: an output
fails when any of its criteria fails, and each is a number compared with a bound. Pure (no rich, no
comparison modules loaded): render/text.py and render/json.py both read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bnbwd_cli.judge.comparison import Comparison


@dataclass(frozen=True)
class Criterion:
    """One criterion an output is held to. ``statistic``: "max_units" (its worst element, in units of the error
    scale, against K), "mismatches" (failing elements against those allowed), "rel_l2" (the fixed rule's norm test) or
    "systematic_scale" (|scale| of actual vs reference, overall or in ``channel``, against its threshold).
    ``checked``: False for a systematic scale reported under --no-bias-check (it decides nothing)."""

    statistic: str
    value: float
    threshold: float
    passed: bool
    channel: int | None = None
    checked: bool = True


def criteria_of(c: Comparison) -> tuple[Criterion, ...]:
    """The criteria that decided ``c``, in the order the report states them."""
    criteria: list[Criterion] = []
    elements_ok = c.mismatches <= c.allowed_mismatches
    if c.scaled is not None and c.allowed_mismatches == 0 and c.max_units is not None:
        criteria.append(Criterion("max_units", c.max_units.value, c.scaled.max_units, elements_ok))
    else:
        criteria.append(Criterion("mismatches", float(c.mismatches), float(c.allowed_mismatches), elements_ok))
    if c.tolerance is not None:
        criteria.append(Criterion("rel_l2", c.rel_l2, c.tolerance.rel_l2, c.rel_l2_passed))
    if c.bias is not None:
        channel, scale, threshold = c.bias.decisive()
        checked = c.scaled is not None and c.scaled.bias_check
        passed = not (checked and abs(scale) > threshold)
        criteria.append(Criterion("systematic_scale", scale, threshold, passed, channel, checked))
    return tuple(criteria)


def deciding(c: Comparison) -> Criterion:
    """The criterion that decided: the first one failed, else the first (the elements')."""
    criteria = criteria_of(c)
    return next((t for t in criteria if not t.passed), criteria[0])
