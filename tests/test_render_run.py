"""render/run.py: what `bnbwd run` tells a person besides its outputs: the non-finite warning."""

from __future__ import annotations

import numpy as np

from bnbwd_cli.core.summary import OutputStats
from bnbwd_cli.render.run import RunFacts, nonfinite_warning


def _facts(stats: dict[str, OutputStats]) -> RunFacts:
    return RunFacts(spec="generic", data_format="NCHW", canonical_format="NCX", epsilon=1e-5, training=True,
                    inputs={}, outputs={}, written=[], elapsed_s=0.0, core="numpy", stream=False, stats=stats)


def test_no_warning_when_every_output_is_finite():
    stats = {name: OutputStats(-1.0, 1.0, 0) for name in ("diff_src", "diff_gamma", "diff_beta")}
    assert nonfinite_warning(_facts(stats)) is None


def test_the_warning_counts_the_non_finite_values_of_each_output_that_has_some():
    stats = {"diff_src": OutputStats(np.nan, np.nan, 12), "diff_gamma": OutputStats(0.0, 1.0, 0),
             "diff_beta": OutputStats(0.0, 1.0, 1)}
    warning = nonfinite_warning(_facts(stats))
    assert warning.startswith("warning: non-finite outputs (diff_src 12, diff_beta 1 NaN/Inf values)")
    assert "diff_gamma" not in warning
