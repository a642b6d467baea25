"""The judge's passes give the numbers of the plain formulas, whatever their blocks, pieces, buffers and shortcuts.

bnbwd_cli/scratch.py's buffers replace fresh temporaries in the diff_src pass; judge/model.py's _PartialSums skips
numpy's loops over NXC's length-1 rows; details are gathered in the judging pass or in a second one. Each is held
to the quantity it computes, stated directly, or to the same pass over fresh blocks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnbwd_cli.core import Op
from bnbwd_cli.dtypes import to_float64
from bnbwd_cli.judge import diff_src, model, sets
from bnbwd_cli.judge.bias import ChannelRegression
from bnbwd_cli.judge.job import Job
from bnbwd_cli.judge.tolerance import Judging, MaxMismatch, PerOutput
from bnbwd_cli.layout import view3
from bnbwd_cli.scratch import Scratch


@pytest.mark.parametrize("s", [1, 5])
def test_partial_sums_are_the_sums_of_squared_prefix_sums(s: int) -> None:
    """The NXC shortcut (rows of one element) and the blocked prefix sums: per channel, the total of its elements
    and sum_k S_k**2, S_k the prefix sums of its elements in storage order, across blocks."""
    rng = np.random.default_rng(11)
    blocks = [1e4 + rng.standard_normal((n, 6, s)) for n in (40, 3, 17)]
    partial = model._PartialSums(6)
    for values in blocks:
        partial.add(values, slice(0, 6))
    rows = np.concatenate([values.transpose(1, 0, 2).reshape(6, -1) for values in blocks], axis=1)  # (c, elements)
    np.testing.assert_allclose(partial.total, [math.fsum(row) for row in rows], rtol=1e-14)
    prefix = np.cumsum(rows, axis=1)
    np.testing.assert_allclose(partial.partial_squares, (prefix * prefix).sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(partial.squares, (rows * rows).sum(axis=1), rtol=1e-14)


def test_scale_and_xhat_into_buffers_equal_the_formulas() -> None:
    rng = np.random.default_rng(12)
    xhat, dy, ref = (rng.standard_normal((3, 4, 9)) for _ in range(3))
    base, per_xhat, per_dy = (rng.uniform(0, 1e-6, 4) for _ in range(3))
    scale = model.DiffSrcScale(base, per_xhat, per_dy, 2.0**-24)
    where = slice(0, 4)
    expected = (base[:, None] + per_xhat[:, None] * np.abs(xhat) + per_dy[:, None] * np.abs(dy)
                + 2.0**-24 * np.abs(ref))
    out = (np.full(xhat.shape, np.nan), np.full(xhat.shape, np.nan))
    assert np.array_equal(scale.block(xhat, dy, ref, where, out=out), expected)
    assert np.array_equal(scale.block(xhat, dy, ref, where), expected)
    src, mean, invstd = rng.standard_normal((3, 4, 9)), rng.standard_normal(4), rng.uniform(0.5, 2, 4)
    plain = (src - mean[:, None]) * invstd[:, None]
    assert np.array_equal(model.xhat_block(src.copy(), where, mean, invstd), plain)
    in_place = src.copy()
    assert model.xhat_block(in_place, where, mean, invstd, out=in_place) is in_place
    assert np.array_equal(in_place, plain)


@pytest.mark.parametrize("dtype, data_format", [(np.float32, "NCX"), (np.float64, "NCX"), (np.float32, "NXC")])
def test_diff_src_pass_with_buffers_matches_fresh_blocks(dtype, data_format, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of uneven size (the last one smaller) through the reused buffers: the regression's sums equal
    those of fresh float64 blocks fed to a regression of its own, and float64 inputs are read, never written."""
    monkeypatch.setattr(diff_src, "BLOCK", 150)
    rng = np.random.default_rng(13)
    shape = (7, 5, 30) if data_format == "NCX" else (7, 30, 5)
    src = rng.standard_normal(shape).astype(dtype)
    dy = rng.choice([-1.0, 0.5, 2.0], size=shape).astype(dtype)
    axes = (0, 2) if data_format == "NCX" else (0, 1)
    inputs = Op(src, dy, src.mean(axes), src.var(axes), None, epsilon=1e-5, data_format=data_format)
    kept = (src.copy(), dy.copy())
    reference = rng.standard_normal(shape).astype(dtype)
    actual = (reference * (1 + 1e-6) + rng.choice([0.0, 1e-3], size=shape)).astype(dtype)
    facts = model.channel_facts(inputs)
    regression = diff_src._regression_pass(actual, reference, inputs, "f32" if dtype == np.float32 else "f64")
    plain = ChannelRegression(5, regression.dtype)
    a3, r3, dy3, x3 = (view3(x, data_format) for x in (actual, reference, dy, src))
    for where in model.blocks(a3.shape, 150):
        xhat = (to_float64(x3[where]) - facts.mean[where[1]][:, None]) * facts.invstd[where[1]][:, None]
        plain.add(xhat, to_float64(r3[where]).copy(), to_float64(a3[where]).copy(), to_float64(dy3[where]).copy(), where[1])
    assert np.array_equal(regression.cross, plain.cross) and np.array_equal(regression.dd, plain.dd)
    assert np.array_equal(regression.ulp_squares, plain.ulp_squares)
    assert regression.cross[0, :, :, 0].sum() == actual.size
    assert np.array_equal(src, kept[0]) and np.array_equal(dy, kept[1])
    result = sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, Judging(), inputs=inputs)
    assert result.outputs[0].comparison.mismatches > 0


@pytest.mark.parametrize("s, channels", [(1, 3), (3, 3), (1, 1), (3, 1)])
def test_sequential_float32_sum_adds_in_storage_order(s: int, channels: int) -> None:
    """The sum a sequential float32 kernel makes, element after element: terms near 1e4 with unit noise, where
    a pairwise or blocked sum rounds differently (checked: the plain float64 sum is far from it). One channel
    too: numpy reduces a (rows, 1) array pairwise."""
    rng = np.random.default_rng(14)
    blocks = [(1e4 + rng.standard_normal((n, channels, s)), slice(0, channels)) for n in (700, 5, 300)]
    sequential = model._Sequential32(channels)
    for terms, where in blocks:
        sequential.add(terms, where)
    expected = np.zeros(channels, np.float32)
    for terms, _ in blocks:
        for row in terms.astype(np.float32):
            for column in row.T:
                expected = expected + column  # float32 + float32: one rounding per element
    assert np.array_equal(sequential.total, expected)
    exact = sum(terms.sum(axis=(0, 2)) for terms, _ in blocks)
    assert np.abs(expected - exact).max() > 1.0  # the order shows: a pairwise sum would not match


def test_safe_ratio_in_place_keeps_its_rules_for_zero_denominators() -> None:
    from bnbwd_cli.judge.rules import safe_ratio

    numerator = np.array([2.0, 0.0, -1.0, 3.0, np.nan, 6.0])
    denominator = np.array([0.0, 0.0, 0.0, -0.0, 0.0, 2.0])
    expected = np.array([np.inf, 0.0, 0.0, np.inf, 0.0, 3.0])
    assert np.array_equal(safe_ratio(numerator, denominator), expected)
    in_place = numerator.copy()
    assert safe_ratio(in_place, denominator, out=in_place) is in_place
    assert np.array_equal(in_place, expected)  # 3/-0 is -inf before the fix: the sign is read before the divide


def _stated_channels(shape, axis, fails, abs_err, ratio) -> tuple:
    """Per channel: its elements' mismatch count, max |a - r| and max ratio (NaN wins, as in np.maximum)."""
    from bnbwd_cli.judge.accumulators import ChannelStat

    def per_channel(values):
        return np.moveaxis(values.reshape(shape), axis, 0).reshape(shape[axis], -1)

    rows = int(np.prod(shape)) // shape[axis]
    return tuple(ChannelStat(c, rows, int(f.sum()), float(np.max(a)), float(np.max(r)))
                 for c, (f, a, r) in enumerate(zip(per_channel(fails), per_channel(abs_err), per_channel(ratio))))


@pytest.mark.parametrize("shape, axis, sizes", [
    ((3, 4, 10), 1, [40, 40, 40]),  # NCX, chunks of whole rows
    ((3, 4, 10), 1, [7, 33, 0, 1, 79]),  # NCX, chunks that cut runs
    ((6, 5, 4), 2, [20, 40, 60]),  # channels last, whole rows: the (rows, C) view
    ((6, 5, 4), 2, [13, 2, 105]),  # channels last, cut rows
    ((2, 3, 4, 5), 1, [60, 60]),  # NCHW
])
def test_channel_table_by_runs_is_each_channels_count_and_maxima(shape, axis, sizes) -> None:
    from bnbwd_cli.judge.accumulators import Channels

    rng = np.random.default_rng(15)
    total = int(np.prod(shape))
    fails = rng.random(total) < 0.3
    abs_err, ratio = rng.random(total), rng.random(total) * 2
    ratio[5], abs_err[17], ratio[total - 1] = np.inf, np.nan, np.nan  # NaN and inf propagate as np.maximum does
    chunks, offset = [], 0
    for size in sizes:
        chunks.append((fails[offset:offset + size], abs_err[offset:offset + size], ratio[offset:offset + size], offset))
        offset += size
    assert offset == total
    fast = Channels(shape, axis)
    with np.errstate(invalid="ignore"):  # NaN into np.maximum: the judge's passes ignore it too
        for chunk in chunks:
            fast.update(*chunk)
        expected = _stated_channels(shape, axis, fails, abs_err, ratio)
    assert repr(fast.finish()) == repr(expected)
    assert sum(stat.mismatches for stat in expected) == fails.sum()


def test_scratch_reuses_its_memory_grows_on_demand_and_is_per_thread() -> None:
    import threading

    scratch = Scratch()
    first = scratch.get("a", (4, 5))
    assert first.shape == (4, 5) and first.dtype == np.float64
    assert np.shares_memory(scratch.get("a", 7), first)  # smaller: the same memory
    assert not np.shares_memory(scratch.get("b", 20), first)  # another name: its own
    grown = scratch.get("a", 100)
    assert grown.size == 100 and not np.shares_memory(grown, first)
    assert scratch.get("a", 3, np.dtype(np.float32)).dtype == np.float32  # another dtype: a new buffer
    seen = []
    thread = threading.Thread(target=lambda: seen.append(scratch.get("b", 20)))
    thread.start()
    thread.join()
    assert not np.shares_memory(seen[0], scratch.get("b", 20))


def test_to_float64_into_a_buffer_is_the_plain_upcast() -> None:
    import ml_dtypes

    rng = np.random.default_rng(13)
    values = rng.standard_normal(50)
    buffer = np.full(50, np.nan)
    for dtype in (np.float16, np.float32, ml_dtypes.bfloat16):
        narrow = values.astype(dtype)
        got = to_float64(narrow, out=buffer)
        assert np.array_equal(got, narrow.astype(np.float32).astype(np.float64))
        assert got is buffer  # every narrow dtype lands in out (bfloat16 through float32)
    assert to_float64(values, out=buffer) is values  # float64 is itself: no copy


@pytest.mark.parametrize("with_inputs", [True, False], ids=["scaled", "fixed"])
@pytest.mark.parametrize("ulps", [3, 40], ids=["passing", "failing"])
def test_details_gathered_up_front_equal_the_second_pass(monkeypatch, with_inputs: bool, ulps: int) -> None:
    """--json/--verbose gather every output's details in the judging pass: the same document as computing them
    in a second pass on first use, with one pass over diff_src instead of two. A failing diff_src gathers them in
    its one pass either way (from where it is seen to fail)."""
    from bnbwd_cli.app.judge import reference_outputs
    from bnbwd_cli.render.json import Source, report_document
    from tests.conftest import make_inputs

    monkeypatch.setenv("BNBWD_CORE", "numpy")  # the NumPy passes (compiled, the judging pass is no _diff_src_pass)
    rng = np.random.default_rng(14)
    arrays = make_inputs(rng, (4, 6, 9, 7))
    op = Op(*(arrays[k] for k in ("src", "diff_dst", "mean", "variance", "gamma")), epsilon=1e-5, data_format="NCX")
    reference = reference_outputs(op, ("diff_src", "diff_gamma", "diff_beta"))
    actual = {name: value.copy() for name, value in reference.items()}
    bits = actual["diff_src"].reshape(-1).view(np.uint32)
    bits[::5] += rng.integers(1, ulps, bits[::5].size).astype(np.uint32)  # some elements off by a few ulps
    actual["diff_gamma"][::2] *= np.float32(1 + 3e-6)
    passes = []
    diff_src_pass = diff_src._diff_src_pass
    monkeypatch.setattr(diff_src, "_diff_src_pass", lambda *args, **kw: passes.append(1) or diff_src_pass(*args, **kw))
    documents = []
    for up_front in (False, True):
        passes.clear()
        judging = Judging(details_up_front=up_front)
        result = sets.compare_sets(actual, reference, judging, data_format="NCX", inputs=op if with_inputs else None)
        documents.append(report_document(result, Source("bnbwd verify", "a", "r")))  # reads every detail
        assert result.outputs[0].comparison.passed == (ulps == 3 or not with_inputs)  # (fixed: within its atol)
        assert len(passes) == (0 if not with_inputs else 1 if up_front or ulps == 40 else 2)
    assert documents[0] == documents[1]
    assert any(output["comparison"]["worst"] for output in documents[0]["outputs"]), "no details in the document"


@pytest.mark.parametrize("rows, columns", [(1, 3), (5000, 3), (700, 128), (2049, 64)])
def test_cumsum_by_bands_of_rows_is_numpys_cumsum(rows: int, columns: int) -> None:
    """model.cumsum_rows folds each band's carry into its first row: the same additions as np.cumsum(axis=0)."""
    rng = np.random.default_rng(rows)
    plane = 1e4 + rng.standard_normal((rows, columns)) * 10.0 ** rng.integers(-8, 8, (rows, columns))
    plane[rows // 2, 0] = np.inf
    assert model.cumsum_rows(plane).tobytes() == np.cumsum(plane, axis=0).tobytes()


def small_op(rng: np.random.Generator, data_format: str) -> tuple[Op, tuple[int, ...]]:
    """A float32 problem of 5 channels, M = 240, in either layout, with its shape."""
    shape = (6, 5, 40) if data_format == "NCX" else (6, 40, 5)
    src = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    axes = (0, 2) if data_format == "NCX" else (0, 1)
    return Op(src, dy, src.mean(axes), src.var(axes), None, epsilon=1e-5, data_format=data_format), shape


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("non_finite", [False, True])
def test_diff_src_judged_in_pieces_equals_whole_blocks(data_format: str, non_finite: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a block (the last one smaller) give every number of whole blocks, the relative L2 included
    (its sums stay by block), with non-finite elements and with the details."""
    rng = np.random.default_rng(17)
    inputs, shape = small_op(rng, data_format)
    reference = rng.standard_normal(shape).astype(np.float32)
    actual = (reference * (1 + 1e-6) + rng.choice([0.0, 1e-7, 1e-3], size=shape)).astype(np.float32)
    if non_finite:
        actual[1, 2, 3], reference[4, 1, 2], actual[5, 0, 0], reference[5, 0, 0] = np.nan, np.inf, 3e38, -3e38
    judging = Judging(details_up_front=True)
    monkeypatch.setattr(diff_src, "BLOCK", 500)

    def judged(piece: int) -> str:
        monkeypatch.setattr(diff_src, "PIECE", piece)
        result = sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, judging, inputs=inputs)
        comparison = result.outputs[0].comparison
        return repr(comparison) + repr(comparison.details)

    assert judged(70) == judged(40) == judged(500)


def test_judging_progress_climbs_to_its_total_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_sets' progress: (done, total) never going back, the pass over the inputs and every output counted
    (diff_src block by block), ending at done == total; the verdict and its numbers the same as without it."""
    monkeypatch.setattr(diff_src, "BLOCK", 150)
    rng = np.random.default_rng(5)
    src = rng.standard_normal((6, 5, 40)).astype(np.float32)
    dy = rng.standard_normal(src.shape).astype(np.float32)
    inputs = Op(src, dy, src.mean((0, 2)), src.var((0, 2)), None, epsilon=1e-5, data_format="NCX")
    from bnbwd_cli import core

    result = core.backward(inputs, core.Settings(outputs=("diff_src", "diff_beta")))
    reference = {"diff_src": result.diff_src, "diff_beta": result.diff_beta}
    actual = {"diff_src": result.diff_src * np.float32(1 + 1e-6), "diff_beta": result.diff_beta}
    seen: list[tuple[int, int]] = []
    told = sets.compare_sets(actual, reference, Judging(), inputs=inputs,
                             progress=lambda done, total: seen.append((done, total)))
    plain = sets.compare_sets(actual, reference, Judging(), inputs=inputs)
    total = 2 * src.size + 5
    assert len(seen) > 4 and {t for _, t in seen} == {total} and seen[-1] == (total, total)
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))
    assert repr(told.outputs) == repr(plain.outputs)


def _inputs(rng: np.random.Generator) -> Op:
    src = rng.standard_normal((4, 5, 30)).astype(np.float32)
    diff_dst = rng.standard_normal(src.shape).astype(np.float32)
    return Op(src, diff_dst, src.mean((0, 2)), src.var((0, 2)), None, epsilon=1e-5, data_format="NCX")


@pytest.mark.parametrize("block", [7, 150, 1 << 16])
def test_lazy_details_equal_a_detailed_single_pass(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diff_src, "BLOCK", block)
    rng = np.random.default_rng(3)
    inputs = _inputs(rng)
    reference = rng.standard_normal(inputs.src.shape).astype(np.float32)
    actual = reference + rng.choice([0.0, 1e-6, 1e-2], size=reference.shape).astype(np.float32)
    job = Job(("diff_src", "diff_src"), Judging(top=5), sets.tensor_layout("NCX", 3))
    case = diff_src._DiffSrc(actual, reference, job, inputs, model.channel_facts(inputs))
    comparison = diff_src.judge_diff_src(actual, reference, job, inputs, lambda: case.facts)
    single = diff_src._diff_src_pass(case, detailed=True)
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
        monkeypatch.setattr(diff_src, "BLOCK", block)
        out = sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, Judging(), inputs=inputs)
        results.append(out.outputs[0].comparison)
    for other in results[1:]:
        assert (other.mismatches, other.max_units, other.max_abs) == (results[0].mismatches, results[0].max_units,
                                                                     results[0].max_abs)
        assert other.bias.significant == results[0].bias.significant
        assert other.bias.scale == pytest.approx(results[0].bias.scale, rel=1e-9)
        assert other.bias.stderr == pytest.approx(results[0].bias.stderr, rel=1e-9)


@pytest.mark.parametrize("first_failure, allowed", [(0, 0), (333, 0), (333, 6), (590, 0)])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_a_failing_diff_src_gathers_its_details_in_its_one_pass(first_failure: int, allowed: int, data_format: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the judging pass has seen more mismatches than allowed, it gathers the details from there on, after a
    detailed judgement of the pieces before: every detail is the detailed pass's from the start, bit for bit
    (masks, where, heat map and NaN positions included), and reading them starts no second pass."""
    monkeypatch.setattr(diff_src, "BLOCK", 150)
    monkeypatch.setattr(diff_src, "PIECE", 40)
    rng = np.random.default_rng(first_failure)
    inputs, shape = small_op(rng, data_format)
    reference = rng.standard_normal(shape).astype(np.float32)
    actual = (reference + rng.choice([0.0, 1e-7, 1e-6], size=shape)).astype(np.float32)
    flat = actual.reshape(-1)
    flat[first_failure::7] += 0.5  # failures from this flat index on
    flat[first_failure + 3] = np.nan
    passes = []
    real = diff_src._diff_src_pass
    monkeypatch.setattr(diff_src, "_diff_src_pass", lambda *args, **kw: passes.append(args[1]) or real(*args, **kw))
    results = []
    for up_front in (False, True):
        judging = Judging(top=5, details_up_front=up_front, max_mismatch=PerOutput(MaxMismatch(allowed)))
        results.append(sets.compare_sets({"diff_src": actual}, {"diff_src": reference}, judging, data_format=data_format,
                                         inputs=inputs).outputs[0].comparison)
    lazy, up_front = results
    assert not lazy.passed and lazy.mismatches > allowed
    assert passes == [False, True]  # (the second: up front)
    assert repr(lazy) == repr(up_front) and lazy.details == up_front.details
    assert passes == [False, True]  # reading the details started no pass
    assert lazy.details.where is not None and lazy.details.nonfinite_where is not None and lazy.worst[0].ratio > 1


@pytest.mark.parametrize("k", [0, 1, 5])
def test_worst_elements_ranked_from_candidates_are_the_whole_ranking(k: int) -> None:
    """accumulators.Worst ranks only a chunk's elements at or above the k-th largest ratio kept: the k worst of the
    whole output all the same, ties (many equal ratios, across chunks) to the lowest index, non-positive ratios never."""
    from bnbwd_cli.judge.accumulators import Worst

    rng = np.random.default_rng(k)
    ratio = rng.choice([0.0, -1.0, 0.5, 2.0, 3.0, 7.0], size=4000) * rng.choice([1.0, 1.0, 1.0 + 1e-9], size=4000)
    ratio[3100:3110] = 9.0  # late ties at the top
    fails, units = ratio > 1, ratio * 2
    worst = Worst(k)
    for start in range(0, ratio.size, 300):
        worst.update(ratio[start:start + 300], fails[start:start + 300], units[start:start + 300], start)
    actual = np.arange(ratio.size, dtype=np.float32).reshape(40, 100)
    got = [(e.index, e.ratio, e.passed, e.units) for e in worst.finish(actual, actual, "f32")]
    order = sorted((i for i in range(ratio.size) if ratio[i] > 0), key=lambda i: (-ratio[i], i))[:k]
    assert got == [(divmod(i, 100), ratio[i], not fails[i], units[i]) for i in order]


@pytest.mark.parametrize("shape", [(1, 42, 3136), (3, 5, 16), (2, 7, 15), (40, 128, 1), (1, 1, 500), (4, 3, 64)])
def test_channels_found_by_runs_are_each_positions_channel(shape: tuple[int, int, int]) -> None:
    """diff_src.channels_at (runs searched where a channel's run is long): the channel each flat position's index
    says, for any subset of positions, none, all, or runs left out entirely."""
    rng = np.random.default_rng(sum(shape))
    size = math.prod(shape)
    for share in (0.0, 0.03, 0.5, 1.0):
        positions = np.flatnonzero(rng.random(size) < share)
        expected = 9 + positions // shape[2] % shape[1]
        assert np.array_equal(diff_src.channels_at(positions, shape, 9), expected)
    positions = np.arange(shape[2] * 2, size) if size > shape[2] * 2 else np.arange(size)
    assert np.array_equal(diff_src.channels_at(positions, shape, 0), positions // shape[2] % shape[1])
