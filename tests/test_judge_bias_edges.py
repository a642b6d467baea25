"""The systematic scale's thresholds at their edges (judge/bias.py): the floor of BIAS_FLOOR_UNITS unit roundoffs,
each channel's own flag, and the sums' allowance for a float32 accumulator's correlated roundings
(SYSTEMATIC_UNITS). Each is a second test beside the end-to-end ones: a threshold moved either way fails here."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.judge.bias import pooled_bias, vector_bias

# docs/tolerances.md's numbers, written here (not imported) so that a change of the judge's constants fails here
BIAS_Z, BIAS_FLOOR_UNITS, SYSTEMATIC_UNITS = 6.0, 16.0, 4.0
UNIT = 2.0**-24
SURE = UNIT * 1e-6  # a standard error far below the floor: the floor alone decides


@pytest.mark.parametrize("factor, significant", [(0.99, False), (1.01, True)])
def test_an_overall_scale_this_side_of_the_floor(factor, significant):
    scale = np.full(6, factor * BIAS_FLOOR_UNITS * UNIT)
    bias = pooled_bias(scale, np.full(6, SURE), UNIT)
    assert bias.threshold == pytest.approx(BIAS_FLOOR_UNITS * UNIT) and bias.floor == pytest.approx(BIAS_FLOOR_UNITS * UNIT)
    assert bias.significant is significant
    assert len(bias.channels) == (6 if significant else 0)


def test_a_statistically_sure_scale_below_the_floor_passes_and_above_it_fails_in_one_channel():
    """One channel off by 1.5 floors (others exact): only it is flagged; at 0.9 floors none is, although each is
    thousands of standard errors from zero."""
    for factor, flagged in ((1.5, (3,)), (0.9, ())):
        scale = np.zeros(8)
        scale[3] = factor * BIAS_FLOOR_UNITS * UNIT
        bias = pooled_bias(scale, np.full(8, 1e-3 * UNIT), UNIT)
        assert tuple(c for c, _, _ in bias.channels) == flagged
        assert bias.significant is bool(flagged)


@pytest.mark.parametrize("z, flagged", [(BIAS_Z * 0.98, False), (BIAS_Z * 1.02, True)])
def test_a_channel_is_flagged_beyond_z_standard_errors_of_its_own(z, flagged):
    """A channel's own estimate against its own standard error (the floor far below): flagged just past BIAS_Z."""
    stderr = np.full(8, 100 * UNIT)
    scale = np.zeros(8)
    scale[5] = z * stderr[5]
    bias = pooled_bias(scale, stderr, UNIT)
    assert [c for c, _, _ in bias.channels] == ([5] if flagged else [])
    assert not bias.channels or bias.channels[0][2] == pytest.approx(stderr[5])


@pytest.mark.parametrize("factor, significant", [(0.98, False), (1.02, True)])
def test_the_sums_systematic_allowance_at_its_edge(factor, significant):
    """diff_gamma/diff_beta: a common relative scale up to SYSTEMATIC_UNITS times what a sequential float32 sum's
    correlated roundings fit to is a correct kernel's; just past it is a deviation."""
    reference = np.linspace(1.0, 2.0, 16)
    noise = np.full(16, 1e-12)  # the statistical threshold far below the allowance
    systematic = np.full(16, 1e-5)  # relative: with |r| weights the fit to it is 1e-5 * mean|r| / mean r^2
    allowance = SYSTEMATIC_UNITS * float(np.sum(np.abs(reference) * systematic) / np.sum(reference * reference))
    actual = reference * (1 + factor * allowance)
    bias = vector_bias(actual, reference, noise, UNIT, systematic)
    assert bias.floor == pytest.approx(allowance) and bias.threshold == pytest.approx(allowance)
    assert bias.scale == pytest.approx(factor * allowance, rel=1e-6)
    assert bias.significant is significant
    assert vector_bias(actual, reference, noise, UNIT).significant  # without the allowance, the floor is 16 u
