"""Out-of-core runs: inputs read by channel blocks, diff_src written by channel blocks, no memory mapping.

Channels are independent in batch norm, so the core runs on one block of channels at a time: the block's
src and diff_dst are read with explicit reads (files.blocks.NpyBlocks: any byte order or memory order,
a file truncated while it is read is a clean error), the core computes, and the block of diff_src is
written with pwrite into a preallocated temp file (files.write.NpyBlockWriter: a full disk fails at the
preallocation). Peak memory is about STREAM_BLOCK_BYTES (at least one channel), whatever the input size.
The core's reduction order is fixed per channel, so the bits are those of an in-memory run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bnbwd_cli.errors import InputError
from bnbwd_cli.files.blocks import NpyBlocks, npy_data_bytes, open_npy_blocks
from bnbwd_cli.files.common import available_memory
from bnbwd_cli.files.write import NpyBlockWriter
from bnbwd_cli import core as compute_core
from bnbwd_cli.layout import channel_axis
from bnbwd_cli.core.summary import OutputStats, scan

# Stream automatically when src + diff_dst (.npy files) exceed this share of available memory, or this size:
# from a few hundred MB up, reading by blocks beats loading on memory (and a private copy of every input),
# and on time where blocks are long runs (NCHW).
STREAM_MEMORY_FRACTION = 0.25
STREAM_MIN_BYTES = 256 << 20
# Working set of one block of channels: src and diff_dst (as read and native), diff_src and the core's scratch.
STREAM_BLOCK_BYTES = 256 << 20
BYTES_PER_ELEMENT_FACTOR = 6


def should_stream(sources: dict[str, str], data_format: str | None, *, memory_only: bool = False) -> bool:
    """True when the .npy inputs src and diff_dst are large: over a share of available memory (loading them
    would risk running out), or over STREAM_MIN_BYTES unless `memory_only`. Not for the size alone when blocks
    of channels would each read src's whole file (short runs: channels last, small planes): streaming then
    copies the inputs once per block, which costs more than loading them once.
    """
    needed = sum(npy_data_bytes(sources[name]) for name in ("src", "diff_dst") if name in sources)
    available = available_memory()
    if available is not None and needed > STREAM_MEMORY_FRACTION * available:
        return True
    return not memory_only and needed > STREAM_MIN_BYTES and not _rereads_file(sources.get("src"), data_format)


def _rereads_file(source: str | None, data_format: str | None) -> bool:
    """Whether streaming src by blocks of channels would read its whole file once per block."""
    try:
        blocks = open_npy_blocks(source, "src") if source and data_format else None
    except InputError:
        return False  # unreadable: the read reports it
    if blocks is None:
        return False
    try:
        if blocks.ndim < 2:
            return False
        axis = channel_axis(data_format, blocks.ndim)
        return blocks.reads_whole_rows(axis, block_width(per_channel_bytes(blocks.shape, blocks.dtype.itemsize, axis)))
    except InputError:
        return False  # an unknown format: validation reports it
    finally:
        blocks.close()


@dataclass(frozen=True)
class StreamedResult:
    """diff_gamma/diff_beta in memory (None if not asked for), diff_src's stats (it is in the writer's file)."""

    diff_gamma: np.ndarray | None
    diff_beta: np.ndarray | None
    diff_src_stats: OutputStats | None
    core: str


def _block(source, axis: int, c0: int, c1: int) -> np.ndarray:  # NpyBlocks or ndarray
    if isinstance(source, NpyBlocks):
        return source.channels(axis, c0, c1)
    return np.ascontiguousarray(source[(slice(None),) * axis + (slice(c0, c1),)])


def per_channel_bytes(shape: tuple[int, ...], itemsize: int, axis: int) -> int:
    """Working set of one channel of a streamed block (BYTES_PER_ELEMENT_FACTOR bytes per byte of src)."""
    channels = shape[axis]
    return (math.prod(shape) // channels if channels else 0) * itemsize * BYTES_PER_ELEMENT_FACTOR


def block_width(per_channel: int, budget: int = 0) -> int:
    """Channels a block holds within `budget` (STREAM_BLOCK_BYTES by default): at least one."""
    return max((budget or STREAM_BLOCK_BYTES) // max(per_channel, 1), 1)


def channel_ranges(channels: int, per_channel: int, budget: int = 0) -> list[tuple[int, int]]:
    """Blocks of whole channels whose working set fits `budget` (at least one channel a block)."""
    width = block_width(per_channel, budget)
    return [(c0, min(c0 + width, channels)) for c0 in range(0, channels, width)]


def _merge(a: OutputStats | None, b: OutputStats) -> OutputStats:
    if a is None:
        return b
    return OutputStats(min(a.minimum, b.minimum), max(a.maximum, b.maximum), a.nonfinite + b.nonfinite)


def run_streamed(op: compute_core.Op, settings: compute_core.Settings,
                 diff_src_out: NpyBlockWriter | None) -> StreamedResult:
    """core.backward(op, settings) block by block of channels: op's src and diff_dst may be NpyBlocks (read a block
    at a time), each block is op with its channels' arrays, run with settings (settings.progress: the whole run's
    progress); diff_src goes to diff_src_out (settings.diff_src_out is not used)."""
    src, progress = op.src, settings.progress
    axis = channel_axis(op.data_format, src.ndim)
    channels = src.shape[axis]
    per_channel = per_channel_bytes(src.shape, src.dtype.itemsize, axis)
    sums: dict[str, list[np.ndarray]] = {"diff_gamma": [], "diff_beta": []}
    stats, core, done = None, "numpy", 0
    for c0, c1 in channel_ranges(channels, per_channel):
        def block_progress(finished: int, total: int, base: int = done, size: int = per_channel // BYTES_PER_ELEMENT_FACTOR // src.dtype.itemsize * (c1 - c0)) -> None:
            if progress is not None:
                progress(base + finished * size // max(total, 1), src.size)

        block = replace(op, src=_block(src, axis, c0, c1), diff_dst=_block(op.diff_dst, axis, c0, c1),
                        mean=op.mean[c0:c1], variance=op.variance[c0:c1],
                        gamma=op.gamma[c0:c1] if op.gamma is not None else None)
        result = compute_core.backward(block, replace(settings, diff_src_out=None, progress=block_progress))
        core = result.core
        done += src.size // channels * (c1 - c0)
        if result.diff_src is not None and diff_src_out is not None:
            if result.diff_src.size:  # N = 0 or an empty spatial axis: nothing to store (the file holds 0 bytes)
                diff_src_out.write_channels(axis, c0, c1, result.diff_src)
            stats = _merge(stats, result.stats["diff_src"])  # gathered in the core's write pass
        for name in sums:
            if getattr(result, name) is not None:
                sums[name].append(getattr(result, name))
    if progress is not None:
        progress(src.size, src.size)
    empty = np.zeros(0, dtype=op.mean.dtype)
    gathered = {name: (np.concatenate(parts) if parts else empty) if name in settings.outputs else None
                for name, parts in sums.items()}
    if channels == 0 and diff_src_out is not None:
        stats = scan(np.zeros(src.shape, dtype=src.dtype))
    return StreamedResult(gathered["diff_gamma"], gathered["diff_beta"], stats, core)
