"""A note on a failing output that is not a cause of the deviation: an output stored wider than it was
computed (every element exactly a bfloat16/float16 value), judged at the wider format's precision.

The causes themselves are tested hypotheses: judge/diagnosis/.
"""

from __future__ import annotations

import numpy as np

from bnbwd_cli.dtypes import exact_narrower
from bnbwd_cli.judge.comparison import Comparison, Hint

# the diagnosis' answers that name no cause: shown after every cause or note
UNEXPLAINED = ("unexplained", "not-diagnosed")


def precision_hints(comparison: Comparison, actual: np.ndarray) -> tuple[Hint, ...]:
    """A failing f32/f64 output whose every element is exactly a bf16 (or f16) value: it was made in that
    precision and upcast, so it is being held to the wider format's tolerance."""
    if comparison.passed:
        return ()
    narrower = exact_narrower(actual)
    if narrower is None or narrower == comparison.dtype:
        return ()
    name = {"bf16": "bfloat16", "f16": "float16"}[narrower]
    bits = " (or its int16 bits, read with --bf16 KEY)" if narrower == "bf16" else ""
    text = (f"every element of actual is exactly a {name} value although it is stored as {comparison.actual_dtype}: "
            f"the kernel computed it in {narrower} and upcast it, and it is judged at {comparison.dtype} precision; "
            f"save the {name} tensor itself{bits} to judge it as {narrower}")
    return (Hint("computed-narrower", text),)
