"""judge/where.py: families of planted failing masks (random shapes, axes, ranges, periods, lanes, tails, layouts),
each described in the words and fields a reader needs, and the heat map's counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnbwd_cli.judge.heat_map import heat_map
from bnbwd_cli.judge.failures import Failures
from bnbwd_cli.judge.index_words import distinct, index_ranges, indices_text
from bnbwd_cli.judge.where import Coordinates, Where, localize

NCX, NXC = ("n", "c", "h", "w"), ("n", "h", "w", "c")
SEEDS = range(12)


def _coordinates(shape, layout):
    return Coordinates(shape, NCX if layout == "NCX" else NXC, 1 if layout == "NCX" else 3)


def _shape(rng, layout, low=3, high=20):
    n, c, h, w = (int(v) for v in rng.integers(low, high, 4))
    return (n, c, h, w) if layout == "NCX" else (n, h, w, c)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_one_axis_range_is_named_with_its_count(seed, layout):
    rng = np.random.default_rng(seed)
    shape = _shape(rng, layout, low=4)
    axis = int(rng.integers(0, 4))
    lo = int(rng.integers(0, shape[axis] - 1))
    hi = int(rng.integers(lo, min(shape[axis] - 1, lo + shape[axis] - 2) + 1))
    if lo == 0 and hi == shape[axis] - 1:
        hi -= 1
    mask = np.zeros(shape, dtype=bool)
    mask[(slice(None),) * axis + (slice(lo, hi + 1),)] = True
    where = localize(mask, _coordinates(shape, layout))
    name = (NCX if layout == "NCX" else NXC)[axis]
    span = f"{lo}" if lo == hi else f"{lo}..{hi}"
    if where.kind == "range":  # a leading axis's range is one stretch of the buffer: its box follows the colon
        assert where.start == int(np.flatnonzero(mask)[0]) and f"{name}={span}" in where.text
    else:
        assert where.kind == "axes", where
        assert where.text.startswith(f"{name}={span} only ({hi - lo + 1} of {shape[axis]} ")
        assert where.axes == ((name, ((lo, hi),)),)
    others = [n for n in (NCX if layout == "NCX" else NXC) if n != name]
    assert where.text.endswith("all " + ", ".join(others)) or where.kind == "range"
    assert where.exact and where.covered == mask.sum()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_spatial_tile_names_both_axes(seed, layout):
    rng = np.random.default_rng(100 + seed)
    shape = _shape(rng, layout, low=8, high=40)
    h_axis, w_axis = (2, 3) if layout == "NCX" else (1, 2)
    tile = []
    for axis in (h_axis, w_axis):
        size = int(rng.integers(2, shape[axis] // 2))
        start = int(rng.integers(1, shape[axis] - size))
        tile.append((start, start + size - 1))
    mask = np.zeros(shape, dtype=bool)
    index = [slice(None)] * 4
    index[h_axis], index[w_axis] = (slice(a, b + 1) for a, b in tile)
    mask[tuple(index)] = True
    where = localize(mask, _coordinates(shape, layout))
    assert where.kind == "axes", where
    (h0, h1), (w0, w1) = tile
    assert where.text == f"h={h0}..{h1}, w={w0}..{w1}; all n, c"
    assert where.axes == (("h", ((h0, h1),)), ("w", ((w0, w1),)))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_period_in_storage_order(seed):
    rng = np.random.default_rng(200 + seed)
    # dimensions odd: no trailing block of axes is a multiple of the period, so only storage order describes it
    shape = tuple(int(v) * 2 + 1 for v in rng.integers(2, 9, 4))
    period = int(rng.choice([4, 8, 16, 32, 64]))
    offset = int(rng.integers(0, period))
    mask = np.zeros(shape, dtype=bool)
    mask.reshape(-1)[offset::period] = True
    where = localize(mask, _coordinates(shape, "NCX"))
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(period % 10, "th")
    assert where.kind == "period" and where.period == period and where.lanes == ((offset, offset),), where
    assert where.text == f"every {period}{suffix} element in storage order, offset {offset}"
    assert where.exact


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("warp", [32, 64])
def test_lanes_of_a_warp_sized_group(seed, warp):
    rng = np.random.default_rng(300 + seed)
    shape = (int(rng.integers(2, 6)), 6, 10, 12)  # trailing blocks 12, 120, 720: none a multiple of 32 or 64
    lo = int(rng.integers(0, warp - 2))
    hi = int(rng.integers(lo + 1, warp - 1))
    mask = np.zeros(shape, dtype=bool)
    flat = mask.reshape(-1)
    lanes = np.arange(flat.size) % warp
    flat[(lanes >= lo) & (lanes <= hi)] = True
    where = localize(mask, _coordinates(shape, "NCX"))
    assert where.kind == "period" and where.period == warp, where
    assert where.text == f"lanes {lo}..{hi} of every {warp}-element group in storage order"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_the_last_elements_of_the_buffer(seed, layout):
    rng = np.random.default_rng(400 + seed)
    shape = _shape(rng, layout, low=5)
    count = int(rng.integers(2, mask_size := math.prod(shape) // 3))
    mask = np.zeros(shape, dtype=bool)
    mask.reshape(-1)[-count:] = True
    where = localize(mask, _coordinates(shape, layout))
    assert where.kind in ("range", "axes"), where
    if where.kind == "range":
        assert where.text.startswith(f"the last {count} elements of the buffer: ")
        assert (where.start, where.stop) == (mask_size * 3 - count if mask_size * 3 == mask.size else mask.size - count,
                                             mask.size)
    else:  # the tail is a whole box of leading indices (n=N-1 only, ...): one range of one axis says it
        assert where.complexity == 1 and where.exact


def test_the_issue_s_stale_tail_reads_as_it_does_in_the_buffer():
    mask = np.zeros((8, 28, 28, 64), dtype=bool)
    mask.reshape(-1)[-256:] = True
    where = localize(mask, _coordinates(mask.shape, "NXC"))
    assert where.text == "the last 256 elements of the buffer: n=7, h=27, w=24..27; all c"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_tail_of_each_channel_s_reduction_order(seed):
    rng = np.random.default_rng(500 + seed)
    n, c, h, w = (int(v) for v in rng.integers(3, 12, 4))
    count = int(rng.integers(2, h * w))  # within the last sample: one range of the reduction order, two axes' ranges at least
    mask = np.zeros((n, c, h, w), dtype=bool)
    mask.reshape(n, c, h * w)[-1, :, -count:] = True
    where = localize(mask, _coordinates(mask.shape, "NCX"))
    assert where.kind == "reduction", where
    assert where.text == f"the last {count} of each channel's {n * h * w} elements in reduction order"
    assert (where.start, where.stop) == (n * h * w - count, n * h * w)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_few_elements_are_named_one_by_one(seed):
    rng = np.random.default_rng(600 + seed)
    shape = _shape(rng, "NCX", low=6)
    count = int(rng.integers(1, 4))
    flat = np.sort(rng.choice(math.prod(shape), count, replace=False))
    if count > 1 and np.diff(flat).min() == 1:
        return  # neighbours make a range: another family
    mask = np.zeros(shape, dtype=bool)
    mask.reshape(-1)[flat] = True
    where = localize(mask, _coordinates(shape, "NCX"))
    names = ["; ".join(" ".join(f"{a}={int(i)}" for a, i in zip(NCX, np.unravel_index(p, shape))) for p in [q])
             for q in flat]
    assert where.kind == "elements", where
    assert where.text == f"{count} element{'s' if count > 1 else ''}: " + "; ".join(names)


@pytest.mark.parametrize("seed", SEEDS)
def test_channels_of_a_sum_as_ranges(seed):
    rng = np.random.default_rng(700 + seed)
    count = int(rng.integers(8, 200))
    mask = np.zeros(count, dtype=bool)
    for _ in range(int(rng.integers(1, 4))):
        start = int(rng.integers(0, count - 2))
        mask[start:start + int(rng.integers(1, 6))] = True
    if mask.all():
        mask[-1] = False
    where = localize(mask, Coordinates((count,), ("c",), None))
    ranges = index_ranges(np.flatnonzero(mask))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in ranges)
    assert where.kind in ("axes", "elements", "range"), where
    if where.kind == "axes":
        assert where.text == f"c={text} only ({mask.sum()} of {count} channels)"
        assert where.axes == (("c", ranges),)


@pytest.mark.parametrize("step", [2, 3, 8])
def test_channels_at_a_stride(step):
    mask = np.zeros(64, dtype=bool)
    mask[5::step] = True
    where = localize(mask, Coordinates((64,), ("c",), None))
    assert where.complexity == 1 and where.exact
    assert f"every {step}" in where.text


def test_ranges_in_words():
    assert indices_text([0, 1, 2, 3, 4, 5, 6, 7, 12]) == "0..7, 12"
    assert indices_text([3, 7, 11, 15]) == "3, 7, ..., 15 (every 4th)"
    assert indices_text([5]) == "5"
    assert indices_text(list(range(0, 40, 3)) + [41]) == "0, 3, 6, 9, 12, 15 and 9 more"  # 15 ranges, 6 shown


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_stray_failures_do_not_hide_a_box(seed, layout):
    rng = np.random.default_rng(800 + seed)
    shape = _shape(rng, layout, low=10, high=24)
    channel = 1 if layout == "NCX" else 3
    lo = int(rng.integers(0, shape[channel] // 2))
    mask = np.zeros(shape, dtype=bool)
    mask[(slice(None),) * channel + (slice(lo, lo + 3),)] = True
    stray = rng.choice(mask.size, max(1, int(mask.sum()) // 50), replace=False)
    mask.reshape(-1)[stray] = True
    where = localize(mask, _coordinates(shape, layout))
    assert where.kind == "axes" and where.axes == (("c", ((lo, lo + 2),)),), where
    assert where.covered >= 0.9 * where.failing and not where.exact
    assert where.text.endswith(f" ({where.failing - where.covered} of the {where.failing} elsewhere)")


def test_nothing_simple_says_so_with_the_densest_channel():
    rng = np.random.default_rng(9)
    mask = rng.random((6, 16, 9, 9)) < 0.02
    mask[:, 5] |= rng.random((6, 9, 9)) < 0.3
    where = localize(mask, _coordinates(mask.shape, "NCX"))
    assert where.kind == "scattered"
    assert where.text.startswith(f"no simple pattern covers them: {mask.sum()} failing elements in ")
    assert "densest c=5 " in where.text


def test_none_and_every_element():
    assert localize(np.zeros((2, 3, 4, 5), dtype=bool), _coordinates((2, 3, 4, 5), "NCX")) is None
    where = localize(np.ones((2, 3, 4, 5), dtype=bool), _coordinates((2, 3, 4, 5), "NCX"))
    assert where.kind == "all" and where.text == "every element"


def test_plain_arrays_get_dim_names():
    mask = np.zeros((5, 7), dtype=bool)
    mask[:, 2] = True
    assert localize(mask, Coordinates((5, 7))).text == "dim1=2 only (1 of 7 indices); all dim0"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_heat_map_counts_every_failure_in_its_cell_both_ways(seed, layout):
    rng = np.random.default_rng(900 + seed)
    shape = _shape(rng, layout, low=3, high=40)
    channel = 1 if layout == "NCX" else 3
    for density in (0.01, 0.5):  # from positions, and from the mask
        mask = rng.random(shape) < density
        picture = heat_map(mask, channel, rows=8, columns=12)
        assert sum(map(sum, picture.failing)) == mask.sum()
        assert sum(map(sum, picture.elements)) == mask.size
        by_channel = np.moveaxis(mask, channel, 0).reshape(shape[channel], -1)  # (c, its positions in storage order)
        for r, (c0, c1) in enumerate(picture.channels):
            for k, (p0, p1) in enumerate(picture.positions):
                assert picture.failing[r][k] == by_channel[c0:c1 + 1, p0:p1 + 1].sum()
        assert (Failures(mask).positions is not None) == (density < 0.05)


def test_heat_map_needs_a_channel_axis():
    assert heat_map(np.ones(8, dtype=bool), None) is None


@pytest.mark.parametrize("offset", [0, 7, 31])
def test_a_stride_across_channels_last_says_both(offset):
    mask = np.zeros((2, 3, 5, 128), dtype=bool)
    mask.reshape(-1)[offset::32] = True
    where = localize(mask, _coordinates(mask.shape, "NXC"))
    assert where.kind == "axes" and where.axes == (("c", tuple((c, c) for c in range(offset, 128, 32))),)
    assert where.text == (f"c={offset}, {offset + 32}, ..., {offset + 96} (every 32nd) only (4 of 128 channels); "
                          f"all n, h, w; also every 32nd element in storage order, offset {offset}")


@pytest.mark.parametrize("seed", range(4))
def test_the_sign_of_the_errors_is_said_when_one_sided(seed):
    """with_sign: all on one side -> "all above/below the reference"; at least ONE_SIGN -> its percent; fewer: no
    words; the count is kept either way."""
    from bnbwd_cli.judge.where import ONE_SIGN, with_sign

    rng = np.random.default_rng(seed)
    failing = int(rng.integers(10, 1000))
    base = Where("axes", "c=3 only (1 of 8 channels); all n, h, w", failing, failing, failing)
    side = ("above", "below")[seed % 2]
    one = failing if side == "above" else 0
    assert with_sign(base, one).text == f"{base.text}; all {side} the reference" and with_sign(base, one).above == one
    most = int(np.ceil(ONE_SIGN * failing)) + 1
    if most < failing:
        said = with_sign(base, most if side == "above" else failing - most)
        assert said.text == f"{base.text}; {100 * most / failing:.3g}% {side} the reference", said.text
    half = failing // 2
    assert with_sign(base, half).text == base.text and with_sign(base, half).above == half



@pytest.mark.parametrize("seed", range(4))
def test_failures_over_the_whole_tensor_say_how_many_not_a_buffer_range(seed):
    """Nearly every element failing, spread at random (or all but the buffer's two ends): "all but N of the M
    elements", not "the last M elements of the buffer" nor "elements 1..M-2"; most of them: their share."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(3, 9, size=4))
    where = Coordinates(shape, ("n", "c", "h", "w"), 1)
    size = math.prod(shape)
    mask = np.ones(shape, bool)
    mask.reshape(-1)[[0, size - 1]] = False
    found = localize(mask, where)
    assert (found.kind, found.text) == ("most", f"all but 2 of the {size} elements")
    share = float(rng.uniform(0.6, 0.8))
    mask = rng.random(shape) < share
    found = localize(mask, where)
    failing = int(mask.sum())
    assert found.kind == "most" and found.covered == failing and found.region == size
    assert found.text == f"{100 * failing / size:.3g}% of the {size} elements, spread over the whole tensor"


@pytest.mark.parametrize("seed", range(6))
def test_a_region_of_a_small_error_is_found_from_its_elevated_elements(seed):
    """A region off by only a few units fails in about half of its elements (the rest just inside the allowance):
    no description of the failures alone holds (half its elements do not fail), but the elevated ones (error over
    half the allowance) fill it. Rows, a tile or a stride, with strays: the region is named with how many of its
    elements fail; without the elevated mask, "no simple pattern"."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(2, 5)), int(rng.integers(3, 9)), int(rng.integers(12, 30)), int(rng.integers(12, 30)))
    where = Coordinates(shape, ("n", "c", "h", "w"), 1)
    region = np.zeros(shape, bool)
    kind = ("rows", "tile", "stride")[seed % 3]
    if kind == "rows":
        lo = int(rng.integers(1, shape[2] - 4))
        region[:, :, lo:lo + 3] = True
        words = f"h={lo}..{lo + 2} only (3 of {shape[2]} rows); all n, c, w"
    elif kind == "tile":
        h0, w0 = int(rng.integers(1, shape[2] - 8)), int(rng.integers(1, shape[3] - 8))
        region[:, :, h0:h0 + 6, w0:w0 + 6] = True
        words = f"h={h0}..{h0 + 5}, w={w0}..{w0 + 5}; all n, c"
    else:
        offset = int(rng.integers(0, 32))
        region.reshape(-1)[offset::32] = True
        words = f"every 32nd element in storage order, offset {offset}"
    failing = region & (rng.random(shape) < rng.uniform(0.3, 0.48))
    elevated = region & (rng.random(shape) < 0.97) | failing
    stray = np.unravel_index(int(rng.integers(region.size)), shape)
    elevated[stray] = True  # an elevated element elsewhere
    if kind != "stride":  # (a stride's failures alone may read as a sparser period)
        assert localize(failing, where).kind == "scattered"
    found = localize(failing, where, elevated)
    inside = int(np.count_nonzero(failing))
    assert found.covered == found.failing == inside and found.region == int(region.sum())
    if kind == "stride" and found.text == words:  # half of the stride failing: the failures alone said it
        return
    assert found.text.startswith(f"{words} ({inside} of its {int(region.sum())} elements fail, "), found.text
    assert "are off by more than 0.5 of their allowance)" in found.text


def test_errors_larger_in_magnitude_are_said_when_their_sign_is_mixed():
    """A scale (1 + 4e-6) moves each element away from zero: mixed above/below, all larger in magnitude."""
    from bnbwd_cli.judge.where import with_sign

    base = Where("axes", "c=3 only (1 of 8 channels); all n, h, w", 100, 100, 100)
    assert with_sign(base, 48, 100).text == f"{base.text}; all larger in magnitude than the reference"
    assert with_sign(base, 48, 3).text == f"{base.text}; 97% smaller in magnitude than the reference"
    assert with_sign(base, 0, 50).text == f"{base.text}; all below the reference"  # the plainer word first
    assert with_sign(base, 50, 50).text == base.text and with_sign(base, 50, 50).larger == 50


@pytest.mark.parametrize("seed", range(4))
def test_lanes_of_each_channel_s_reduction_order_channels_last(seed):
    """Channels last: a warp reducing each channel over its positions, lanes lo..hi of every 32 (or 64) positions
    wrong in every channel: not lanes of the buffer (a period of 32*C), said in each channel's reduction order."""
    rng = np.random.default_rng(seed)
    warp = (32, 64)[seed % 2]
    shape = (int(rng.integers(2, 5)), int(rng.integers(8, 14)), int(rng.integers(8, 14)), int(rng.integers(3, 9)))
    where = Coordinates(shape, ("n", "h", "w", "c"), 3)
    lo = int(rng.integers(0, warp - 4))
    hi = lo + int(rng.integers(1, 4))
    positions = np.arange(math.prod(shape[:3]))
    mask = np.zeros(shape, bool)
    mask.reshape(-1, shape[3])[(positions % warp >= lo) & (positions % warp <= hi)] = True
    found = localize(mask, where)
    assert found.kind == "reduction" and found.exact, found
    assert found.text == (f"lanes {lo}..{hi} of every {warp} positions of each channel's {positions.size} elements "
                          "in reduction order"), found.text


@pytest.mark.parametrize("seed", SEEDS)
def test_distinct_is_numpys_unique_of_integers(seed):
    """index_words.distinct (np.unique without its numpy.ma import): the same sorted values, same dtype."""
    rng = np.random.default_rng(seed)
    for size in (0, 1, 2, 7, 500):
        for dtype in (np.int64, np.int32, np.uint8):
            values = rng.integers(0, [1, 3, 255][seed % 3] + 1, size).astype(dtype)
            found = distinct(values)
            assert found.dtype == np.unique(values).dtype and np.array_equal(found, np.unique(values))
    assert np.array_equal(distinct([[3, 1], [3, 2]]), [1, 2, 3])  # any shape, flattened as np.unique does


@pytest.mark.parametrize("seed", SEEDS)
def test_failures_inside_a_box_counts_what_a_fancy_index_counts(seed):
    """Failures.inside (dense: a take along one axis at a time, full axes skipped; sparse: the positions' own
    coordinates) counts the failures of the product of the index sets, as mask[np.ix_(*sets)] does."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 9, 4))
    for density in (0.005, 0.5):  # sparse and dense
        mask = rng.random(shape) < density
        failures = Failures(mask)
        for _ in range(5):
            sets = [np.flatnonzero(rng.random(size) < rng.choice([0.3, 1.0])) for size in shape]
            assert failures.inside(sets) == int(np.count_nonzero(mask[np.ix_(*sets)])), (shape, sets)


@pytest.mark.parametrize("seed", SEEDS)
def test_failures_dense_lanes_folded_from_a_wider_count_are_each_periods_own(seed):
    """Failures.per_lane, dense: counted modulo a multiple of the period near LANE_ROW, kept, and folded for every
    period that divides it: the failures at each residue of the flat index, over the whole mask and over a prefix,
    for sizes that are not a multiple of any of them."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(100, 20000))
    mask = rng.random(size) < 0.4
    failures = Failures(mask)
    assert failures.positions is None  # dense
    positions = np.flatnonzero(mask)
    for period in (2, 3, 32, 64, 7, 96, 1024, 1500):
        for prefix in (None, int(rng.integers(1, size))):
            kept = positions if prefix is None else positions[positions < prefix]
            assert np.array_equal(failures.per_lane(period, prefix), np.bincount(kept % period, minlength=period))


@pytest.mark.parametrize("shape", [(3, 13, 5, 7), (2, 16, 9, 11), (4, 7, 3, 130)])
def test_heat_map_of_a_dense_mask_counts_each_cell(shape):
    """The dense heat map (channel groups then position blocks, block by block): each cell's count is its own,
    with unequal channel groups (13, 7: prime) and equal ones (16)."""
    mask = np.random.default_rng(sum(shape)).random(shape) < 0.5
    picture = heat_map(mask, 1, rows=4, columns=9)
    assert Failures(mask).positions is None
    by_channel = np.moveaxis(mask, 1, 0).reshape(shape[1], -1)
    for r, (c0, c1) in enumerate(picture.channels):
        for k, (p0, p1) in enumerate(picture.positions):
            assert picture.failing[r][k] == by_channel[c0:c1 + 1, p0:p1 + 1].sum()


@pytest.mark.parametrize("kinds", [("f32", "f32"), ("bf16", "bf16"), ("f16", "f32"), ("f64", "f64")])
def test_the_failures_sign_counts_are_the_same_gathered_or_in_pieces(kinds):
    """detail_stats._above: how many failing elements lie above the reference and how many are larger in magnitude, by
    gathering the few (at most 1/SPARSE of them) or in pieces over the mask: each equals the plain float64 count."""
    from bnbwd_cli.dtypes import dtype_from_name, to_float64
    from bnbwd_cli.judge.detail_stats import SIGN_PIECE, _above
    from bnbwd_cli.judge.failures import SPARSE

    rng = np.random.default_rng(len(kinds[0]) + len(kinds[1]))
    size = 3 * SIGN_PIECE + 11
    reference = rng.standard_normal(size).astype(dtype_from_name(kinds[1]))
    actual = (rng.standard_normal(size) * 0.5).astype(dtype_from_name(kinds[0]))
    actual[::7] = reference[::7].astype(actual.dtype)  # ties: neither above nor larger
    a64, r64 = to_float64(actual), to_float64(reference)
    for share in (0.5 / SPARSE, 0.3):  # gathered, and in pieces
        mask = rng.random(size) < share
        expected = (int(np.count_nonzero((a64 > r64) & mask)), int(np.count_nonzero((np.abs(a64) > np.abs(r64)) & mask)))
        assert _above(actual, reference, mask) == expected
