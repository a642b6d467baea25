"""A note on a failing output that is not a cause of the deviation: an output stored wider than it was
computed (every element exactly a bfloat16/float16 value), judged at the wider format's precision.

The note is a hypothesis like a hint: "computed in the narrower type and upcast". Every value on a 16-bit grid
is its evidence only when the reference's values are not on that grid too (a float32 sum whose values merely
cancel onto a coarse grid, e.g. sums of small integers, says nothing about how it was computed), and it is said
only when the narrower type's precision explains the deviation: the worst element is within K units of the error
scale that type's unit roundoff gives (the scale is proportional to the unit roundoff). Else the output is wrong
by more than computing narrower explains, and the note would hide that.

The causes themselves are tested hypotheses: judge/diagnosis/.
"""

from __future__ import annotations

import numpy as np

from bnbwd_cli.dtypes import dtype_from_name, exact_narrower, unit_roundoff
from bnbwd_cli.judge.comparison import Comparison, Hint

# the diagnosis' answers that name no cause: shown after every cause or note
UNEXPLAINED = ("unexplained", "not-diagnosed")
GRID_SHARE = 0.5  # of the reference's finite nonzero values on the grid, from which the grid is the data's
# causes the diagnosis names that are the narrower computation itself: the note would say it twice
NARROWER_CAUSES = ("16-bit-accumulation",)


def precision_hints(comparison: Comparison, actual: np.ndarray, reference: np.ndarray | None = None) -> tuple[Hint, ...]:
    """A failing f32/f64 output whose every element is exactly a bf16 (or f16) value, made in that precision and
    upcast (tested as above when ``reference`` is given), so it is held to the wider format's tolerance."""
    if comparison.passed:
        return ()
    narrower = exact_narrower(actual)
    if narrower is None or narrower == comparison.dtype:
        return ()
    if reference is not None and not computed_narrower_explains(comparison, narrower, reference):
        return ()
    name = {"bf16": "bfloat16", "f16": "float16"}[narrower]
    bits = " (or its int16 bits, read with --bf16 KEY)" if narrower == "bf16" else ""
    text = (f"every element of actual is exactly a {name} value although it is stored as {comparison.actual_dtype}: "
            f"the kernel computed it in {narrower} and upcast it, and it is judged at {comparison.dtype} precision; "
            f"save the {name} tensor itself{bits} to judge it as {narrower}")
    return (Hint("computed-narrower", text),)


def on_grid_share(reference: np.ndarray, narrower: str) -> float:
    """The share of the reference's finite nonzero values that are exactly ``narrower`` values."""
    values = np.asarray(reference).reshape(-1)
    values = values[np.isfinite(values) & (values != 0)]
    if values.size == 0:
        return 1.0
    dtype = dtype_from_name("bf16") if narrower == "bf16" else np.dtype(np.float16)  # ("f16" names float128)
    with np.errstate(over="ignore", invalid="ignore"):
        back = values.astype(dtype).astype(values.dtype)
    return float(np.mean(back == values))


def computed_narrower_explains(comparison: Comparison, narrower: str, reference: np.ndarray) -> bool:
    """Does computing in ``narrower`` explain the output: the reference is off that grid (the grid is the kernel's,
    not the data's), and the worst element is within K units at the narrower type's unit roundoff?"""
    if on_grid_share(reference, narrower) >= GRID_SHARE:
        return False
    scaled, worst = comparison.scaled, comparison.max_units
    if scaled is None or worst is None or not np.isfinite(worst.value):
        return scaled is None  # the fixed rule (no error model): the grid is the only evidence there is
    ratio = unit_roundoff(narrower) / scaled.unit
    return worst.value <= scaled.max_units * ratio
