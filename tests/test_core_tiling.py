"""Tiling, threading, f16 conversion and the out-of-core path of the blocked core."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.app import streaming
from bnbwd_cli.core import plan
from bnbwd_cli.files import mapped
from bnbwd_cli.core import rounding
from bnbwd_cli.core.rounding import float_to_half
from bnbwd_cli.core import Op, Settings
from bnbwd_cli.core.reference import reference_backward
from bnbwd_cli.files import blocks as files_blocks
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.blocks import NpyBlocks
from bnbwd_cli.files.write import OutputSet
from tests.oracle import BOUNDS, backward_arrays, normalised_error, op_args

numpy_backward = functools.partial(backward_arrays, core="numpy")  # the tiling under test is the NumPy core's

SHAPES = [((3, 5, 7, 9), "NCX"), ((3, 7, 9, 5), "NXC"), ((2, 3, 1000), "NCX"), ((4, 3), "NCX"), ((1, 1, 1), "NXC")]


def _covered(groups, n, c, s) -> np.ndarray:
    hits = np.zeros((n, c, s), int)
    for group in groups:
        for tile in group.tiles:
            hits[tile.n0 : tile.n1, group.c0 : group.c1, tile.s0 : tile.s1] += 1
    return hits


@pytest.mark.parametrize("row_mode", [False, True], ids=["planes", "rows"])
@pytest.mark.parametrize("budget", [1, 7, 64, 1000, 1 << 20, 1 << 24])
@pytest.mark.parametrize("n,c,s", [(1, 1, 1), (3, 5, 7), (2, 1, 100), (5, 9, 1), (1, 3, 1000), (70, 2, 9000), (300, 3, 1), (2500, 2, 1), (150, 2, 30)])
def test_plan_covers_every_element_once_in_whole_chunks(n, c, s, budget, row_mode):
    shape = plan.geometry(n, c, s)
    groups = plan.plan_groups(shape, 4, budget, row_mode)
    assert (_covered(groups, n, c, s) == 1).all()
    for group in groups:
        for tile in group.tiles:  # whole chunks and blocks: the sums cannot depend on the tiling
            assert tile.n0 % shape.chunk_rows == 0 and (tile.n1 % shape.chunk_rows == 0 or tile.n1 == n)
            assert tile.s0 % shape.block_lanes == 0 and (tile.s1 % shape.block_lanes == 0 or tile.s1 == s)
            assert (tile.s0, tile.s1) == (0, s) or tile.n1 - tile.n0 <= shape.chunk_rows


@pytest.mark.parametrize("shape,data_format", SHAPES, ids=str)
@pytest.mark.parametrize("block_bytes", [64, 4096, None], ids=["tiny", "small", "default"])
def test_tilings_and_threads_agree(rng, shape, data_format, block_bytes):
    args = op_args(rng, shape, data_format)
    base = numpy_backward(*args, epsilon=1e-5, data_format=data_format, threads=1)
    other = numpy_backward(*args, epsilon=1e-5, data_format=data_format, threads=2, block_bytes=block_bytes)
    expected = reference_backward(Op(*args, epsilon=1e-5, data_format=data_format))
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        np.testing.assert_allclose(getattr(other, name), getattr(base, name), rtol=2e-6, atol=1e-6 * np.abs(expected[name]).max())
        assert normalised_error(getattr(other, name), expected[name]) <= BOUNDS["float32"]


def test_threads_give_identical_results(rng):
    args = op_args(rng, (4, 6, 50), "NCX")
    one = numpy_backward(*args, epsilon=1e-5, data_format="NCX", threads=1, block_bytes=256)
    two = numpy_backward(*args, epsilon=1e-5, data_format="NCX", threads=2, block_bytes=256)
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))


def test_float_to_half_rounds_like_numpy():
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.normal(0, s, 4000) for s in (1e-7, 1e-5, 1, 1e3, 7e4)]).astype(np.float32)
    values = np.concatenate([values, np.float32([np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, -0.0, 2.98e-8, 2.99e-8])])
    narrowed = np.empty(values.shape, np.float16)
    scratch = (np.empty(values.shape, np.uint32), np.empty(values.shape, np.uint32))
    float_to_half(values, narrowed, *scratch)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    assert np.array_equal(narrowed.view(np.uint16)[~np.isnan(expected)], expected.view(np.uint16)[~np.isnan(expected)])
    assert np.isnan(narrowed[np.isnan(expected)]).all()


def _near_half_ties(rng: np.random.Generator) -> np.ndarray:
    """float64 values on, just beyond and just short of float16 ties (normal, subnormal, near overflow), and specials."""
    halves = rng.standard_normal(20000).astype(np.float16).astype(np.float64)
    halves = np.concatenate([halves, halves * 2.0**-14, [65504.0, 6.1e-5, 0.0]])
    step = np.spacing(np.abs(halves).astype(np.float16)).astype(np.float64) / 2
    offsets = [0.0, 2.0**-30, -(2.0**-30), 2.0**-45, -(2.0**-45)]
    near = np.concatenate([halves + step * (1 + k) for k in offsets] + [-(halves + step * (1 + k)) for k in offsets])
    return np.concatenate([near, rng.standard_normal(20000) * 2.0 ** rng.uniform(-30, 17, 20000),
                           [np.inf, -np.inf, np.nan, 65520.0, 65519.99, -0.0, 1e300]])


def test_float16_by_numpys_cast_gives_the_float32_detours_bits(monkeypatch):
    """store()'s two float16 routes, NumPy's direct cast and the rounded-to-odd float32 detour, agree bit for bit."""
    if not rounding._half_cast_rounds_once():
        pytest.skip("this NumPy's float64 -> float16 cast rounds twice: store() always takes the float32 detour")
    values = _near_half_ties(np.random.default_rng(6))
    routes = []
    for direct in (True, False):
        monkeypatch.setattr(rounding, "HALF_CAST_ROUNDS_ONCE", direct)
        out = np.empty(values.shape, np.float16)
        rounding.store(values, out)
        routes.append(out)
    finite = ~np.isnan(routes[1])
    assert np.array_equal(routes[0].view(np.uint16)[finite], routes[1].view(np.uint16)[finite])
    assert np.isnan(routes[0][~finite]).all()


def test_the_half_cast_probe_tells_double_rounding_apart():
    """The probes of _half_cast_rounds_once round differently through float32: a double-rounding cast fails it."""
    probe = np.array([1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40), 2.0**-25 + 2.0**-60])
    once = [1 + 2.0**-10, -(1 + 2.0**-10), 2.0**-24]
    twice = probe.astype(np.float32).astype(np.float16).astype(np.float64)
    assert not np.any(twice == once)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64], ids=["f16", "bf16", "f64"])
def test_reduced_and_double_precision_with_split_tiles(rng, dtype):
    args = op_args(rng, (3, 4, 37), "NCX", dtype)
    result = numpy_backward(*args, epsilon=1e-3, data_format="NCX", block_bytes=200, threads=2)
    expected = reference_backward(Op(*args, epsilon=1e-3, data_format="NCX"))
    assert normalised_error(result.diff_src, expected["diff_src"]) <= BOUNDS[np.dtype(dtype).name]


@pytest.mark.parametrize("shape,data_format", SHAPES[:3], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_memmapped_run_matches_in_memory(tmp_path, rng, shape, data_format, dtype):
    src, diff_dst, *stats = op_args(rng, shape, data_format, dtype)
    np.save(tmp_path / "src.npy", src)
    np.save(tmp_path / "dy.npy", diff_dst)
    maps = [np.load(tmp_path / name, mmap_mode="r").view(src.dtype) for name in ("src.npy", "dy.npy")]
    assert mapped.file_mappings(*maps)
    in_memory = numpy_backward(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format)
    out = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype="V2" if dtype is ml_dtypes.bfloat16 else src.dtype,
                                    shape=src.shape)
    result = numpy_backward(*maps, *stats, epsilon=1e-5, data_format=data_format, diff_src_out=out.view(src.dtype),
                            block_bytes=512)
    out.flush()
    del out
    written = np.load(tmp_path / "out.npy")
    if dtype is ml_dtypes.bfloat16:
        written = written.view(ml_dtypes.bfloat16)
    np.testing.assert_allclose(written.astype(np.float64), in_memory.diff_src.astype(np.float64), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.diff_gamma, in_memory.diff_gamma, rtol=1e-6)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failed_block_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with OutputSet() as outputs:
            outputs.new_npy(tmp_path / "out.npy", (4, 4), np.dtype(np.float32)).write_channels(1, 0, 2, np.ones((4, 2), np.float32))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


STREAM_CASES = [((3, 5, 4, 6), "NCX", "C"), ((3, 4, 6, 5), "NXC", "C"), ((3, 5, 4, 6), "NCX", "F"), ((3, 4, 6, 5), "NXC", "F"),
                ((2, 7, 3), "NCX", "big-endian"), ((40, 7), "NXC", "big-endian")]


@pytest.mark.parametrize("shape,data_format,storage", STREAM_CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_streamed_blocks_give_the_in_memory_bits(tmp_path, rng, monkeypatch, shape, data_format, storage, dtype):
    """Out-of-core by blocks of channels (here 1-2 channels a block): any byte or memory order, the same bits."""
    if storage == "big-endian" and dtype is ml_dtypes.bfloat16:
        pytest.skip("bfloat16 has no byte order in .npy (|V2)")
    src, diff_dst, *stats = op_args(rng, shape, data_format, dtype)
    for name, array in (("src", src), ("dy", diff_dst)):
        stored = np.asfortranarray(array) if storage == "F" else array
        stored = stored.astype(stored.dtype.newbyteorder(">")) if storage == "big-endian" else stored
        np.save(tmp_path / f"{name}.npy", stored)
    per_channel = src.size // src.shape[1 if data_format == "NCX" else -1] * src.itemsize * streaming.BYTES_PER_ELEMENT_FACTOR
    monkeypatch.setattr(streaming, "STREAM_BLOCK_BYTES", per_channel * 2)
    op = Op(NpyBlocks(tmp_path / "src.npy", "src"), NpyBlocks(tmp_path / "dy.npy", "diff_dst"), *stats, epsilon=1e-5,
            data_format=data_format)
    run = Settings(core="numpy")
    with OutputSet() as outputs:
        writer = outputs.new_npy(tmp_path / "out.npy", src.shape, src.dtype)
        result = streaming.run_streamed(op, run, writer)
    in_memory = numpy_backward(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format)
    written = np.load(tmp_path / "out.npy")
    assert written.tobytes() == in_memory.diff_src.tobytes()
    assert result.diff_gamma.tobytes() == in_memory.diff_gamma.tobytes()
    assert result.diff_beta.tobytes() == in_memory.diff_beta.tobytes()


@pytest.mark.parametrize("storage", ["C", "F", "big-endian"])
def test_streamed_short_runs_in_many_chunks_give_the_in_memory_bits(tmp_path, rng, monkeypatch, storage):
    """Channels last, rows read (and diff_src read-modify-written) in chunks of 7 rows through one reused buffer,
    the last chunk partial (72 rows = 10 x 7 + 2): the bits of the in-memory run."""
    shape, data_format = (3, 4, 6, 5), "NXC"
    src, diff_dst, *stats = op_args(rng, shape, data_format)
    for name, array in (("src", src), ("dy", diff_dst)):
        stored = np.asfortranarray(array) if storage == "F" else array
        np.save(tmp_path / f"{name}.npy", stored.astype(stored.dtype.newbyteorder(">")) if storage == "big-endian" else stored)
    row = shape[-1] * src.itemsize
    monkeypatch.setattr(files_blocks, "CHUNK_BYTES", 7 * row)
    monkeypatch.setattr(files_write, "CHUNK_BYTES", 7 * row)
    monkeypatch.setattr(streaming, "STREAM_BLOCK_BYTES", src.size // shape[-1] * src.itemsize * streaming.BYTES_PER_ELEMENT_FACTOR * 2)
    op = Op(NpyBlocks(tmp_path / "src.npy", "src"), NpyBlocks(tmp_path / "dy.npy", "diff_dst"), *stats, epsilon=1e-5,
            data_format=data_format)
    run = Settings(core="numpy")
    with OutputSet() as outputs:
        writer = outputs.new_npy(tmp_path / "out.npy", src.shape, src.dtype)
        streaming.run_streamed(op, run, writer)
        read_back = writer.read_all()  # what --reference reads of a streamed diff_src
    expected = numpy_backward(src, diff_dst, *stats, epsilon=1e-5, data_format=data_format).diff_src
    assert np.load(tmp_path / "out.npy").tobytes() == expected.tobytes()
    assert read_back.tobytes() == expected.tobytes()
    assert (tmp_path / "out.npy").stat().st_size == writer.offset + src.nbytes  # nothing written past the array


def test_cli_stream_outputs_match(cli, tmp_path, rng):
    src, diff_dst, mean, variance, gamma = op_args(rng, (2, 3, 4, 5), "NCX")
    paths = {}
    for name, array in dict(src=src, diff_dst=diff_dst, mean=mean, variance=variance, gamma=gamma).items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], array)
    flags = [f"--{name.replace('_', '-')}={path}" for name, path in paths.items()]
    for extra in (["-o", tmp_path / "plain.npz"], ["-o", tmp_path / "streamed.npz", "--stream"]):
        result = cli("run", *flags, "--epsilon", "1e-5", "--format", "NCHW", "-q", *extra)
        assert result.exit_code == 0, result.output
    (tmp_path / "dir").mkdir()
    assert cli("run", *flags, "--epsilon", "1e-5", "--format", "NCHW", "-q", "--stream", "--out-dir", tmp_path / "dir").exit_code == 0
    plain, streamed = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "streamed.npz")
    for name in ("diff_src", "diff_gamma", "diff_beta"):
        np.testing.assert_array_equal(plain[name], streamed[name])
        np.testing.assert_array_equal(plain[name], np.load(tmp_path / "dir" / f"{name}.npy"))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_cli_stream_needs_a_file_output(cli, tmp_path, rng):
    src = rng.normal(size=(2, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "b.npz", src=src, diff_dst=src, mean=np.zeros(3, np.float32), variance=np.ones(3, np.float32))
    result = cli("run", tmp_path / "b.npz", "--epsilon", "1e-5", "--format", "NCX", "--stream")
    assert result.exit_code == 2
