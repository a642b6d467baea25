"""Out-of-core reading: a plain .npy by channel blocks, with explicit reads (pread), never a memory map.

Headers are vetted by files/read.py exactly as for in-memory reads.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import numpy as np

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import raw, sniff
from bnbwd_cli.files.common import cannot_read, reason
from bnbwd_cli.files.npy import as_bfloat16_if_void, as_native, read_npy_header


class NpyBlocks:
    """A .npy file read by channel blocks with pread: no mmap, any byte order or memory order, bounded memory.

    shape/dtype/ndim/size/nbytes describe the array as read_array would return it, so the input checks
    work on it unchanged. The file's size is checked when it is opened and after each read: a file
    truncated (or grown) while it is read is an error, never SIGBUS.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise BnbwdError(f"{cannot_read(what, path)} ({reason(exc)})") from None
        self._size = os.fstat(self._fd).st_size
        with os.fdopen(os.dup(self._fd), "rb") as stream:
            self.header = read_npy_header(stream, self._size, what)
        self.shape, self.dtype = self.header.shape, self.header.logical_dtype
        self._view: np.dtype | None = None
        self.ndim, self.size, self.nbytes = len(self.shape), self.header.size, self.header.nbytes

    def view(self, dtype: np.dtype) -> NpyBlocks:
        """Read the data as another dtype of the same item size (--bf16: uint16 bits as bfloat16)."""
        self._view = self.dtype = np.dtype(dtype)
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def _read_into(self, buffer: np.ndarray, offset: int) -> None:
        """Fill `buffer` (C-contiguous) from the data at `offset`; a file that is shorter, or changed size, is an error."""
        got = pread_into(self._fd, buffer, self.header.offset + offset)
        if got != buffer.nbytes or os.fstat(self._fd).st_size != self._size:
            raise BnbwdError(f"{self.what}: {self.path} changed size while it was read "
                             f"(was {self._size} bytes, now {os.fstat(self._fd).st_size}); nothing was written")

    def _stored(self, axis: int) -> tuple[tuple[int, ...], int]:
        """The shape as stored (reversed for Fortran order) and the channel axis in it."""
        if self.header.fortran_order:
            return self.shape[::-1], self.ndim - 1 - axis
        return self.shape, axis

    def reads_whole_rows(self, axis: int, width: int) -> bool:
        """Whether blocks of `width` channels (fewer than all) are read as whole rows because their contiguous runs
        are short (channels last, small planes, Fortran order): then every block reads the whole file."""
        stored_shape, stored_axis = self._stored(axis)
        inner = math.prod(stored_shape[stored_axis + 1 :])
        return width < stored_shape[stored_axis] and width * inner * self.header.dtype.itemsize < SPAN_MIN_BYTES

    def channels(self, axis: int, c0: int, c1: int) -> np.ndarray:
        """The sub-array [..., c0:c1, ...] along `axis`, C-contiguous, native byte order."""
        stored_shape, stored_axis = self._stored(axis)
        outer = math.prod(stored_shape[:stored_axis])
        channels = stored_shape[stored_axis]
        inner = math.prod(stored_shape[stored_axis + 1 :])
        itemsize = self.header.dtype.itemsize
        row = channels * inner * itemsize
        block = np.empty((outer, c1 - c0, inner), dtype=self.header.dtype)
        # Read straight into the block (or into one reused chunk buffer): no bytes object per read, no second copy.
        raw = block.view(np.uint8).reshape(outer, c1 - c0, inner * itemsize)
        try:
            if not self.reads_whole_rows(axis, c1 - c0):
                for o in range(outer):  # one read per outer index: the block's own bytes only
                    self._read_into(raw[o], o * row + c0 * inner * itemsize)
            else:  # short runs (channels last): read whole rows in chunks and keep the block's columns
                rows = max(CHUNK_BYTES // max(row, 1), 1)
                chunk = np.empty(min(rows, outer) * row, np.uint8)
                for o0 in range(0, outer, rows):
                    o1 = min(o0 + rows, outer)
                    rows_read = chunk[: (o1 - o0) * row]
                    self._read_into(rows_read, o0 * row)
                    raw[o0:o1] = rows_read.reshape(o1 - o0, channels, inner * itemsize)[:, c0:c1]
        except OSError as exc:
            raise BnbwdError(f"{self.what}: cannot read {self.path} ({reason(exc)}); nothing was written") from None
        stored_block = list(stored_shape)
        stored_block[stored_axis] = c1 - c0
        array = block.reshape(stored_block)
        if self.header.fortran_order:
            array = array.transpose()
        array = np.ascontiguousarray(as_native(as_bfloat16_if_void(array)))
        return array.view(self._view) if self._view is not None else array


SPAN_MIN_BYTES = 64 << 10  # a contiguous run worth its own read
CHUNK_BYTES = 8 << 20  # rows read at once when runs are short


def pread_into(fd: int, buffer: np.ndarray, offset: int) -> int:
    """Read from `offset` into the C-contiguous `buffer` until it is full or the file ends; the bytes read."""
    if buffer.nbytes == 0:  # an empty block (N = 0, an empty spatial axis): memoryview cannot cast its shape
        return 0
    view, got = memoryview(buffer).cast("B"), 0
    while got < view.nbytes:
        count = os.preadv(fd, [view[got:]], offset + got)
        if count <= 0:
            break
        got += count
    return got


def open_npy_blocks(source: str, what: str) -> NpyBlocks | None:
    """An out-of-core reader for a plain, regular .npy file; None for anything else (npz, stdin, pipes)."""
    path = Path(source)
    if source == "-" or raw.is_raw(source) or sniff.has_key(source) or not path.is_file():
        return None
    if sniff.file_kind(path, f"{what} ({source})") != "npy":
        return None
    return NpyBlocks(path, f"{what} ({source})")


def npy_data_bytes(source: str) -> int:
    """Data size of a plain .npy path from its header (0 for anything else: npz, stdin, unreadable)."""
    path = Path(source)
    if source == "-" or not path.is_file():
        return 0
    try:
        with path.open("rb") as stream:
            return read_npy_header(stream, None, source).nbytes
    except (BnbwdError, OSError):
        return 0
