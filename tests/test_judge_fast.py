"""The fast scaled-rule judgement gives the numbers of the one it replaced.

``_reference_add`` is ChannelRegression.add as it was before the fast path (all nine products
formed, every element masked): the new one must build bit-identical sums from the same blocks.
Details of a scaled diff_src, now gathered by a second pass on first use, must equal the ones a
detailed single pass gathers.
"""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.dtypes import ulp_spacing
from bnbwd_cli.judge import sets
from bnbwd_cli.judge.bias import _PAIRS, CLUSTERS, ChannelRegression, cluster_of
from bnbwd_cli.core import Op
from bnbwd_cli.judge.model import channel_facts
from bnbwd_cli.judge.tolerance import CompareSettings, Judging


def _reference_add(self: ChannelRegression, xhat, reference, actual, diff_dst, channels) -> None:
    usable = np.isfinite(actual) & np.isfinite(reference) & np.isfinite(xhat)
    w = usable.astype(np.float64)
    basis = (w, np.where(usable, xhat, 0.0), np.where(usable, reference, 0.0))
    d = np.where(usable, actual - reference, 0.0)
    c = basis[0].shape[1]
    products = [(basis[i] * basis[j]).reshape(-1) for i, j in _PAIRS] + [(b * d).reshape(-1) for b in basis]
    first = np.arange(c)[None, :, None] * CLUSTERS
    for clustering, key in enumerate((diff_dst, reference)):
        bits = np.ascontiguousarray(key, dtype=np.float64).view(np.uint64)
        hashed = ((bits * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(58)).astype(np.intp)
        ids = (first + hashed).reshape(-1)
        for k, values in enumerate(products):
            self.cross[clustering, channels, :, k] += np.bincount(ids, values, c * CLUSTERS).reshape(c, CLUSTERS)
    self.dd[channels] += np.einsum("ncs,ncs->c", d, d)
    spacing = np.where(usable, ulp_spacing(np.where(usable, actual, 0.0), self.dtype), 0.0)
    self.ulp_squares[channels] += np.einsum("ncs,ncs->c", spacing, spacing)


def _blocks(rng: np.random.Generator, non_finite: bool):
    shape = (3, 6, 40)
    xhat = rng.standard_normal(shape)
    reference = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    actual = (reference + rng.choice([0.0, 1e-7, 1e-3], size=shape)).astype(np.float32).astype(np.float64)
    diff_dst = rng.choice([-1.0, 0.5, 2.0, 3.0], size=shape)
    if non_finite:
        actual[0, 1, 3], reference[2, 4, 5], xhat[1, 0, 7], actual[1, 2, 2] = np.nan, np.inf, np.nan, -np.inf
    return xhat, reference, actual, diff_dst


def test_cluster_of_matches_the_plain_hash() -> None:
    key = np.random.default_rng(1).standard_normal((2, 3, 50))
    bits = key.view(np.uint64)
    expected = ((bits * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(58)).astype(np.intp)
    assert np.array_equal(cluster_of(key), expected)
    assert cluster_of(key).min() >= 0 and cluster_of(key).max() < CLUSTERS


@pytest.mark.parametrize("piece", [7, 64, 1 << 15])  # pieces cut channels' runs (7), whole rows (64), the block
@pytest.mark.parametrize("non_finite", [False, True])
def test_regression_sums_are_bit_identical_to_the_old_ones(non_finite: bool, piece: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from bnbwd_cli.judge import bias

    monkeypatch.setattr(bias, "PIECE", piece)
    rng = np.random.default_rng(7)
    fast, old = ChannelRegression(12, "f32"), ChannelRegression(12, "f32")
    for channels in (slice(0, 6), slice(6, 12), slice(0, 6)):
        block = _blocks(rng, non_finite)
        fast.add(*block, channels)
        _reference_add(old, *block, channels)
    assert np.array_equal(fast.cross, old.cross)
    assert np.array_equal(fast.dd, old.dd) and np.array_equal(fast.ulp_squares, old.ulp_squares)
    usable = 3 * (3 * 6 * 40 - (4 if non_finite else 0))  # three blocks, four non-finite elements in each
    assert fast.cross[0, :, :, 0].sum() == fast.cross[1, :, :, 0].sum() == usable
    assert fast.cross[1, :, :, 6].any()  # the sums of d were formed
    a, b = fast.fit(), old.fit()
    for name in ("offset", "slope", "scale", "stderr", "residual_rms"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name


def _inputs(rng: np.random.Generator) -> Op:
    src = rng.standard_normal((4, 5, 30)).astype(np.float32)
    diff_dst = rng.standard_normal(src.shape).astype(np.float32)
    return Op(src, diff_dst, src.mean((0, 2)), src.var((0, 2)), None, epsilon=1e-5, data_format="NCX")


@pytest.mark.parametrize("block", [7, 150, 1 << 16])
def test_lazy_details_equal_a_detailed_single_pass(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sets, "BLOCK", block)
    rng = np.random.default_rng(3)
    inputs = _inputs(rng)
    reference = rng.standard_normal(inputs.src.shape).astype(np.float32)
    actual = reference + rng.choice([0.0, 1e-6, 1e-2], size=reference.shape).astype(np.float32)
    job = sets._Job(("diff_src", "diff_src"), CompareSettings(), sets.tensor_layout("NCX", 3), 5)
    case = sets._DiffSrc(actual, reference, job, inputs, channel_facts(inputs))
    comparison = sets._judge_diff_src(actual, reference, job, inputs, case.facts)
    single, _ = sets._diff_src_pass(case, detailed=True, regress=False)
    expected = single.details.finish(actual, reference, single.dtype)
    assert comparison.mismatches > 0
    assert comparison.details == expected
    assert comparison.worst[0].ratio > 1 and comparison.channels is not None


def test_judging_does_not_depend_on_the_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verdicts and counts identical, reported numbers equal to float64 rounding, for any blocking."""
    rng = np.random.default_rng(5)
    inputs = _inputs(rng)
    reference = rng.standard_normal(inputs.src.shape).astype(np.float32)
    actual = reference * np.float32(1 + 3e-6)
    results = []
    for block in (1 << 20, 150, 1 << 16):
        monkeypatch.setattr(sets, "BLOCK", block)
        out = sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, Judging(CompareSettings()), inputs=inputs)
        results.append(out.outputs[0].comparison)
    for other in results[1:]:
        assert (other.mismatches, other.max_units, other.max_abs) == (results[0].mismatches, results[0].max_units,
                                                                     results[0].max_abs)
        assert other.bias.significant == results[0].bias.significant
        assert other.bias.scale == pytest.approx(results[0].bias.scale, rel=1e-9)
        assert other.bias.stderr == pytest.approx(results[0].bias.stderr, rel=1e-9)


@pytest.mark.parametrize("nonzero", [0.0, 0.05, 1.0])  # d: none (an exact output), few (scattered apart), most
def test_regression_sums_skip_zero_differences_bit_for_bit(nonzero: float) -> None:
    """Elements where actual equals the reference add nothing to the sums of d, x*d and r*d: leaving them out
    (all of them, or gathering the few others) gives the sums of every element, bit for bit."""
    rng = np.random.default_rng(21)
    fast, old = ChannelRegression(6, "f32"), ChannelRegression(6, "f32")
    for _ in range(3):
        xhat, reference, actual, diff_dst = _blocks(rng, non_finite=False)
        keep = rng.random(actual.shape) >= nonzero
        actual = np.where(keep, reference, actual)
        fast.add(xhat, reference, actual, diff_dst, slice(0, 6))
        _reference_add(old, xhat, reference, actual, diff_dst, slice(0, 6))
    assert np.array_equal(fast.cross, old.cross) and np.array_equal(fast.dd, old.dd)
    assert np.array_equal(fast.ulp_squares, old.ulp_squares)
    assert fast.cross[0, :, :, 6].any() == (nonzero > 0)


def _scaled_state(actual: np.ndarray, reference: np.ndarray, max_units: float):
    from bnbwd_cli.judge.rules import ScaledRule
    from bnbwd_cli.judge.stats import Accumulator, Setup
    from bnbwd_cli.judge.tolerance import MaxMismatch, Scaled

    setup = Setup("f32", MaxMismatch(3), detailed=False)
    return Accumulator(actual, reference, ScaledRule(Scaled(max_units, 2.0**-24)), setup)


@pytest.mark.parametrize("max_units", [0.0, 5.0])
def test_scale_formed_only_past_one_ulp_gives_the_full_judgement(max_units: float) -> None:
    """Accumulator.add_scaled (the scale only where |a - r| > 1 ULP) against add (the scale everywhere), chunk
    by chunk: an exact chunk, one within an ULP, ones past it with scales of 0, inf and ordinary ones, and one
    whose only errors past an ULP meet an infinite scale; every number of the comparison the same."""
    rng = np.random.default_rng(22)
    size = 400
    reference = rng.standard_normal(6 * size).astype(np.float32).astype(np.float64)
    bits = reference.astype(np.float32).view(np.int32).copy()
    steps = [np.zeros(size), rng.integers(-1, 2, size), rng.integers(-9, 10, size), rng.integers(-40, 41, size),
             rng.integers(-40, 41, size) * (rng.random(size) < 0.05), np.where(np.arange(size) == 7, 5, 0)]
    bits += np.concatenate(steps).astype(np.int32)
    actual = bits.view(np.float32).astype(np.float64)
    scale = rng.uniform(0, 4e-7, reference.size) * (rng.random(reference.size) < 0.9)  # some exactly 0
    scale[3 * size: 3 * size + 50] = np.inf
    scale[5 * size:] = np.inf
    full, shortcut = _scaled_state(actual, reference, max_units), _scaled_state(actual, reference, max_units)
    for start in range(0, reference.size, size):
        a, r, s = (v[start:start + size] for v in (actual, reference, scale))
        with np.errstate(invalid="ignore"):  # K = 0 times an infinite scale
            full.add(a, r, start, s, norms=False)
            shortcut.add_scaled(a, r, a - r, start, lambda positions, s=s: s if positions is None else s[positions])
    assert repr(shortcut.result()) == repr(full.result())
    assert full.result().mismatches > 0 and full.result().max_units.value > 0
    a, r, s = (v[5 * size:] for v in (actual, reference, scale))  # alone: the largest unit is 0, at its first element
    full, shortcut = _scaled_state(a, r, max_units), _scaled_state(a, r, max_units)
    with np.errstate(invalid="ignore"):
        full.add(a, r, 0, s, norms=False)
        shortcut.add_scaled(a, r, a - r, 0, lambda positions: s if positions is None else s[positions])
    assert repr(shortcut.result()) == repr(full.result())
    assert full.result().max_units.index == (0,) and full.result().max_ulp.value > 1


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("problem", ["finite", "non-finite inputs", "negative K"])
def test_judging_pass_equals_the_one_that_forms_every_scale(data_format: str, problem: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The judging pass (scale only past one ULP where the channel's scale is sound) and the detailed pass (the
    scale of every element) give the same verdict and numbers: with NaN and inf in the inputs (those channels'
    scale is not sound, so they are judged the full way), and with a K that would let a within-ULP element fail."""
    monkeypatch.setattr(sets, "BLOCK", 500)
    monkeypatch.setattr(sets, "PIECE", 70)
    rng = np.random.default_rng(23)
    shape = (6, 5, 40) if data_format == "NCX" else (6, 40, 5)
    src = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    axes = (0, 2) if data_format == "NCX" else (0, 1)
    inputs = Op(src, dy, src.mean(axes), src.var(axes), None, epsilon=1e-5, data_format=data_format)
    from bnbwd_cli import core

    reference = core.backward(inputs, core.Settings(outputs=("diff_src",))).diff_src
    if problem == "non-finite inputs":  # (after the reference: a verify whose --inputs hold them, outputs finite)
        src[(1, 1, 2) if data_format == "NCX" else (1, 2, 1)] = np.nan
        dy[(2, 3, 4) if data_format == "NCX" else (2, 4, 3)] = np.inf
    bits = reference.view(np.int32) + rng.integers(-6, 7, shape).astype(np.int32) * (rng.random(shape) < 0.5)
    actual = bits.view(np.float32)
    settings = CompareSettings()
    if problem == "negative K":
        from bnbwd_cli.judge.tolerance import PerOutput

        settings = CompareSettings(max_units=PerOutput(-1.0))
    job = sets._Job(("diff_src",), settings, sets.tensor_layout(data_format, 3), 5)
    with np.errstate(all="ignore"):
        case = sets._DiffSrc(actual, reference, job, inputs, channel_facts(inputs))
        judged = [sets._diff_src_pass(case, detailed=detailed, regress=False)[0].result() for detailed in (False, True)]
    assert repr(judged[0]) == repr(judged[1])
    if problem == "negative K":
        assert judged[0].mismatches > 0
    if problem == "non-finite inputs":  # NaN scales (those channels' units are NaN): not taken for 0
        assert np.isnan(judged[0].min_units)
