"""The judging pass's shortcuts give the numbers of the full judgement: the regression's sums skip d's zeros,
the error scale is formed only past one ULP, and the judging pass equals the detailed one that forms every
scale (judge/bias.py, judge/compare.py, judge/diff_src.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.app.judge import reference_outputs
from bnbwd_cli.judge import bias, diff_src, sets
from bnbwd_cli.judge.bias import ChannelRegression
from bnbwd_cli.judge.job import Job
from bnbwd_cli.judge.model import channel_facts
from bnbwd_cli.judge.tolerance import Judging
from tests.test_judge_bias import _blocks, _stated_sums
from tests.test_judge_passes import small_op


@pytest.mark.parametrize("nonzero", [0.0, 0.05, 1.0])  # d: none (an exact output), few (scattered apart), most
def test_regression_sums_skip_zero_differences_bit_for_bit(nonzero: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Elements where actual equals the reference add nothing to the sums of d, x*d and r*d: the sums from d's
    non-zero elements gathered (SPARSE 1) and from whole pieces (SPARSE -1) are the same bits, and the sums of
    the definition over every element."""
    rng = np.random.default_rng(21)
    blocks = []
    for _ in range(3):
        xhat, reference, actual, diff_dst = _blocks(rng, non_finite=False)
        keep = rng.random(actual.shape) >= nonzero
        blocks.append((xhat, reference, np.where(keep, reference, actual), diff_dst, slice(0, 6)))
    regressions = []
    for sparse in (1.0, -1.0):
        monkeypatch.setattr(bias, "SPARSE", sparse)
        regression = ChannelRegression(6, "f32")
        for block in blocks:
            regression.add(*block)
        regressions.append(regression)
    gathered, whole = regressions
    assert np.array_equal(gathered.cross, whole.cross) and np.array_equal(gathered.dd, whole.dd)
    assert np.array_equal(gathered.ulp_squares, whole.ulp_squares)
    cross, dd, ulp_squares = _stated_sums(blocks, 6)
    np.testing.assert_allclose(gathered.cross, cross, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(gathered.dd, dd, rtol=1e-12, atol=1e-300)
    assert gathered.cross[0, :, :, 6].any() == (nonzero > 0)


def _scaled_state(actual: np.ndarray, reference: np.ndarray, max_units: float):
    from bnbwd_cli.judge.rules import ScaledRule
    from bnbwd_cli.judge.compare import Accumulator, Setup
    from bnbwd_cli.judge.tolerance import MaxMismatch, Scaled

    setup = Setup("f32", MaxMismatch(3), detailed=False)
    return Accumulator(actual, reference, ScaledRule(Scaled(max_units, 2.0**-24)), setup)


@pytest.mark.parametrize("dense_share", [2.0, 0.0])  # the elements past one ULP gathered; the whole chunk judged
@pytest.mark.parametrize("max_units", [0.0, 5.0])
@pytest.mark.parametrize("floor", [None, "exact", "below", "zero"])
def test_scale_formed_only_past_one_ulp_gives_the_full_judgement(max_units: float, dense_share: float, floor: str | None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Accumulator.add_scaled (the scale only where |a - r| > 1 ULP, or the whole chunk judged when most elements
    are: compare.DENSE_SHARE) against add (the scale everywhere), chunk by chunk: an exact chunk, one within an
    ULP, ones past it with scales of 0, inf and ordinary ones, and one whose only errors past an ULP meet an
    infinite scale; every number of the comparison the same. With a lower bound of the scale (``floor_at``: the
    scale itself, a fraction of it, or 0), the scale formed only where an element may fail or reach the k largest
    units kept (k = 4: three mismatches allowed): still the same numbers."""
    from bnbwd_cli.judge import compare

    monkeypatch.setattr(compare, "DENSE_SHARE", dense_share)
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
    lower = {None: None, "exact": scale, "zero": np.zeros_like(scale),
             "below": scale * rng.uniform(0.1, 1.0, scale.size)}[floor]  # (a product by <= 1 rounds to <= s)
    formed = []
    full, shortcut = _scaled_state(actual, reference, max_units), _scaled_state(actual, reference, max_units)
    for start in range(0, reference.size, size):
        a, r, s = (v[start:start + size] for v in (actual, reference, scale))
        floor_at = None if lower is None else (lambda positions, f=lower[start:start + size]: f[positions])
        with np.errstate(invalid="ignore"):  # K = 0 times an infinite scale
            full.add(a, r, start, s, norms=False)
            shortcut.add_scaled(a, r, a - r, start,
                                lambda positions, s=s: formed.append(size if positions is None else positions.size) or (
                                    s if positions is None else s[positions]), floor_at)
    assert repr(shortcut.result()) == repr(full.result())
    assert full.result().mismatches > 0 and full.result().max_units.value > 0
    if floor == "exact" and dense_share and max_units:  # the bound prunes: fewer scales formed than elements past one ULP
        assert sum(formed) < 0.8 * int(np.count_nonzero(np.abs(actual - reference) > 2.0**-23 * np.abs(reference)))
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
    monkeypatch.setattr(diff_src, "BLOCK", 500)
    monkeypatch.setattr(diff_src, "PIECE", 70)
    rng = np.random.default_rng(23)
    inputs, shape = small_op(rng, data_format)
    src, dy = inputs.src, inputs.diff_dst
    from bnbwd_cli import core

    reference = core.backward(inputs, core.Settings(outputs=("diff_src",))).diff_src
    if problem == "non-finite inputs":  # (after the reference: a verify whose --inputs hold them, outputs finite)
        src[(1, 1, 2) if data_format == "NCX" else (1, 2, 1)] = np.nan
        dy[(2, 3, 4) if data_format == "NCX" else (2, 4, 3)] = np.inf
    bits = reference.view(np.int32) + rng.integers(-6, 7, shape).astype(np.int32) * (rng.random(shape) < 0.5)
    actual = bits.view(np.float32)
    judging = Judging(top=5)
    if problem == "negative K":
        from bnbwd_cli.judge.tolerance import PerOutput

        judging = Judging(max_units=PerOutput(-1.0), top=5)
    job = Job(("diff_src",), judging, sets.tensor_layout(data_format, 3))
    with np.errstate(all="ignore"):
        case = diff_src._DiffSrc(actual, reference, job, inputs, channel_facts(inputs))
        judged = [diff_src._diff_src_pass(case, detailed=detailed).result() for detailed in (False, True)]
    assert repr(judged[0]) == repr(judged[1])
    if problem == "negative K":
        assert judged[0].mismatches > 0
    if problem == "non-finite inputs":  # NaN scales (those channels' units are NaN): not taken for 0
        assert np.isnan(judged[0].min_units)


@pytest.mark.parametrize("non_finite", [False, True])
def test_compiled_regression_sums_are_the_numpy_sums_bit_for_bit(non_finite: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With numba (runtime.numba_judging: $BNBWD_CORE=numba here) the pieces' bins, products and scattered sums run
    in one compiled loop (judge/numba_sums.py): the same bits as NumPy's, elements left out and exact pieces too;
    and a whole judged diff_src reports the same numbers either way, through the judging pass's pieces."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(22)
    blocks = []
    for _ in range(3):
        xhat, reference, actual, diff_dst = _blocks(rng, non_finite)
        actual[0] = reference[0]  # an exact row: d is 0 there
        blocks.append((xhat, reference, actual, diff_dst, slice(0, 6)))
    regressions = []
    for core in ("numba", "numpy"):
        monkeypatch.setenv("BNBWD_CORE", core)
        regression = ChannelRegression(6, "f32", elements=1)
        assert (regression.compiled is not None) == (core == "numba")
        for block in blocks:
            regression.add(*block)
        regressions.append(regression)
    compiled, plain = regressions
    assert np.array_equal(compiled.cross, plain.cross) and np.array_equal(compiled.dd, plain.dd)
    assert np.array_equal(compiled.ulp_squares, plain.ulp_squares)
    op, _ = small_op(rng, "NCX")
    reference = reference_outputs(op, ("diff_src",), threads=1)["diff_src"]
    actual = reference.copy()
    actual.reshape(-1)[::7] *= np.float32(1.0 + 2.0**-20)
    if non_finite:
        actual.reshape(-1)[5] = np.nan
    rows = []
    for core in ("numba", "numpy"):
        monkeypatch.setenv("BNBWD_CORE", core)
        for threads in (1, 2):
            result = sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, Judging(threads=threads), inputs=op)
            rows.append(repr(result.outputs[0]) + repr(result.outputs[0].comparison.details))
    assert rows[1:] == rows[:-1]


def _unmoved_problems():
    """(op, diff_src reference) of small problems where a fit's decisions vary: f32/bf16/f16 in both layouts,
    coarse diff_dst, a channel whose diff_dst is constant (r a multiple of xhat: collinear) and a tiny M."""
    import ml_dtypes

    from bnbwd_cli.op import Op

    rng = np.random.default_rng(31)
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        for data_format in ("NCX", "NXC"):
            for shape in ((6, 5, 40), (2, 9, 3)):
                full = shape if data_format == "NCX" else (shape[0], shape[2], shape[1])
                src = (rng.standard_normal(full) * 2 + 0.5).astype(dtype)
                dy = np.round(rng.standard_normal(full) * 2).astype(dtype)  # coarse: few distinct values
                channels = (slice(None), 1) if data_format == "NCX" else (slice(None), slice(None), 1)
                dy[channels] = 1  # constant over a channel
                axes = (0, 2) if data_format == "NCX" else (0, 1)
                stats = src.astype(np.float32)
                op = Op(src, dy, stats.mean(axes), stats.var(axes), rng.uniform(0.5, 1.5, shape[1]).astype(np.float32),
                        epsilon=1e-5, data_format=data_format)
                yield op, reference_outputs(op, ("diff_src",), threads=1)["diff_src"]


def test_an_unmoved_outputs_fit_is_the_exact_sums_fit() -> None:
    """diff_src equal to the reference bit for bit (and finite): the regression's unmoved sums (counts exact, the
    other sums in any order) give each channel's scale and stderr bit for bit as the exact sums do, the channels
    that cannot be fitted (collinear, tiny) included; a moved or non-finite output is not unmoved."""
    seen_unfitted = False
    for op, reference in _unmoved_problems():
        name = {2: "bf16" if "bfloat16" in str(reference.dtype) else "f16", 4: "f32"}[reference.dtype.itemsize]
        assert diff_src._unmoved(reference.copy(), reference)
        exact = diff_src._regression_pass(reference.copy(), reference, op, name).fit()
        unmoved = diff_src._unmoved_pass(reference.copy(), reference, op, name).fit()
        assert unmoved is not None
        assert exact.scale.tobytes() == unmoved.scale.tobytes() and exact.stderr.tobytes() == unmoved.stderr.tobytes()
        seen_unfitted |= bool(np.isnan(exact.scale).any())
        moved = reference.copy()
        moved.reshape(-1).view(f"u{moved.itemsize}")[7] += 1  # one ULP (bf16 has no nextafter)
        nan = reference.copy()
        nan.reshape(-1)[3] = np.nan
        assert not diff_src._unmoved(moved, reference) and not diff_src._unmoved(nan, nan.copy())
        assert not diff_src._unmoved(reference.copy()[::-1], reference[::-1])  # not contiguous: not looked at
    assert seen_unfitted  # (the problems do reach fit's refusals)


@pytest.mark.parametrize("decided", [True, False])  # False: every unmoved fit is undecided, the exact sums decide
@pytest.mark.parametrize("threads", [1, 2])
def test_an_unmoved_output_is_judged_as_by_the_exact_sums(decided: bool, threads: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole judgement of an unmoved diff_src (every number, the bias fit's included) is the one the exact sums
    give, with one thread and two; an undecided unmoved fit falls back to a pass of exact sums."""
    monkeypatch.setenv("BNBWD_CORE", "numpy")  # the NumPy passes (compiled, one pass forms the exact sums)
    op, reference = next(_unmoved_problems())
    passes = []
    for name in ("_unmoved_pass", "_regression_pass"):
        def counted(*args, _name=name, _function=getattr(diff_src, name), **kwargs):
            passes.append(_name)
            return _function(*args, **kwargs)

        monkeypatch.setattr(diff_src, name, counted)

    def judged(unmoved: bool) -> str:
        monkeypatch.setattr(diff_src, "_unmoved", lambda a, r: unmoved)
        result = sets.compare_sets({"diff_src": reference.copy()}, {"diff_src": reference}, Judging(threads=threads),
                                   inputs=op)
        assert result.outputs[0].comparison.bias is not None
        return repr(result.outputs[0]) + repr(result.outputs[0].comparison.details)

    exact = judged(False)
    assert passes == ["_regression_pass"] * (threads > 1)  # (one thread: the judging pass regresses its pieces)
    passes.clear()
    if not decided:
        monkeypatch.setattr(bias, "_decided", lambda *args: False)
    assert judged(True) == exact
    assert passes == ["_unmoved_pass"] + ["_regression_pass"] * (not decided)


def test_unmoved_sums_decide_only_far_from_each_threshold() -> None:
    """bias._decided: a determinant or a resolution ratio within the two orders' rounding of its threshold, or a
    sum that is not finite, is undecided; far from them, decided; channels not checked do not count."""
    count = 1000.0
    gram = np.tile(np.diag([count, 50.0, 40.0]), (3, 1, 1))
    norms = np.sqrt(np.diagonal(gram, axis1=1, axis2=2))
    checked = np.array([True, True, False])
    ulp_squares = np.full(3, 1e-6)
    far = np.array([0.5, 0.9, bias.COLLINEAR])  # the unchecked channel sits on the threshold: not looked at
    assert bias._decided(gram, norms, far, ulp_squares, checked)
    near = far.copy()
    near[1] = bias.COLLINEAR * (1 + 1e-9)
    assert not bias._decided(gram, norms, near, ulp_squares, checked)
    at_resolution = ulp_squares.copy()
    at_resolution[0] = (norms[0, 2] / bias.RESOLUTION) ** 2
    assert not bias._decided(gram, norms, far, at_resolution, checked)
    overflowing = gram.copy()
    overflowing[0, 1, 2] = overflowing[0, 2, 1] = np.inf
    assert not bias._decided(overflowing, norms, far, ulp_squares, checked)
    assert bias._decided(gram, norms, far, ulp_squares, np.zeros(3, bool))


def test_the_scale_floor_is_never_above_the_scale() -> None:
    """DiffSrcScale.floor_at (base + unit*|r|) against at() (two more terms >= 0, the sums rounded): never above,
    with coefficients and values from 0 to huge, subnormal ones included."""
    from bnbwd_cli.judge.model import DiffSrcScale

    rng = np.random.default_rng(31)
    spread = lambda size: rng.choice([0.0, 5e-324, 1e-300, 1.0, 1e300], size) * rng.uniform(0.5, 2, size)
    model = DiffSrcScale(spread(8), spread(8), spread(8), 2.0**-24)
    channel = rng.integers(0, 8, 20000)
    xhat, dy, reference = (spread(20000) * rng.choice([-1, 1], 20000) for _ in range(3))
    with np.errstate(over="ignore"):
        exact, floor = model.at(channel, xhat, dy, reference), model.floor_at(channel, reference)
    assert (floor <= exact).all() and (floor < exact).any() and (floor == exact).any()
