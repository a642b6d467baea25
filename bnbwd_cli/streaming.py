"""Out-of-core runs: memory-mapped inputs, diff_src written through a memmap, atomically.

The NumPy core (core/numpy_core.py) walks the tensor in cache-sized tiles, so over
`np.load(mmap_mode="r")` inputs and a memmapped output only the tiles in flight are
resident: peak memory stays bounded whatever the input size (the page cache holds
the rest and the kernel may drop it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
from numpy.lib import format as npy_format

from bnbwd_cli.errors import BnbwdError

# Stream automatically when src + diff_dst (.npy files) exceed this share of available memory, or this size:
# from a few hundred MB up, mapping beats loading on both time and memory (measured, 2-core EPYC, f32 NCHW:
# 0.27 GB of inputs 0.65 s / 113 MiB streamed against 0.84 s / 431 MiB loaded; 1.07 GB 1.95 s / 112 MiB
# against 3.96 s / 1586 MiB), because loading page-faults in a private copy of every input first.
STREAM_MEMORY_FRACTION = 0.25
STREAM_MIN_BYTES = 256 << 20
COPY_CHUNK = 16 << 20


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def npy_data_bytes(source: str) -> int:
    """Data size of a plain .npy path from its header (0 for anything else: npz, stdin, unreadable)."""
    path = Path(source)
    if source == "-" or not path.is_file():
        return 0
    try:
        with path.open("rb") as stream:
            version = npy_format.read_magic(stream)
            reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
            shape, _, dtype = reader(stream)
        return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    except (OSError, ValueError, EOFError, SyntaxError):
        return 0


def should_stream(sources: dict[str, str], *, memory_only: bool = False) -> bool:
    """True when the .npy inputs src and diff_dst are large: over STREAM_MIN_BYTES or a share of available memory.

    memory_only: only the share of available memory counts (loading would risk running out of memory).
    """
    needed = sum(npy_data_bytes(sources[name]) for name in ("src", "diff_dst") if name in sources)
    available = available_memory()
    limits = ([] if memory_only else [STREAM_MIN_BYTES]) + ([] if available is None else [STREAM_MEMORY_FRACTION * available])
    return bool(limits) and needed > min(limits)


@contextlib.contextmanager
def memmap_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> Iterator[np.ndarray]:
    """A writable memmap of a new .npy, created as a temp file beside `path`, renamed over it on success.

    bfloat16 is stored as np.save stores it (raw |V2), so the file round-trips.
    """
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        os.close(fd)
    except OSError as exc:
        raise BnbwdError(f"output {path}: cannot create a file in {directory} ({exc.strerror})") from None
    try:
        stored = np.dtype("V2") if dtype.kind == "V" or dtype.name == "bfloat16" else dtype
        array = npy_format.open_memmap(temp_name, mode="w+", dtype=stored, shape=shape)
        yield array.view(dtype) if stored != dtype else array
        array.flush()
        del array
        with open(temp_name, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temp_name, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        if isinstance(exc, OSError):
            raise BnbwdError(f"output {path}: write failed ({exc.strerror or exc})") from None
        raise


def add_npy_to_zip(archive: zipfile.ZipFile, key: str, npy_path: Path) -> None:
    """Copy a .npy file into an .npz member `key.npy` in chunks (stored, zip64): no full-size buffer."""
    with npy_path.open("rb") as source, archive.open(f"{key}.npy", "w", force_zip64=True) as member:
        shutil.copyfileobj(source, member, COPY_CHUNK)


def add_array_to_zip(archive: zipfile.ZipFile, key: str, array: np.ndarray) -> None:
    """A small array as an .npz member, as np.savez writes it."""
    with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


@contextlib.contextmanager
def staged_diff_src(output: str | None, out_dir: Path | None, shape: tuple[int, ...],
                    dtype: np.dtype) -> Iterator[tuple[np.ndarray, Path]]:
    """A memmap for diff_src that becomes DIR/diff_src.npy (--out-dir) or a staging .npy beside OUT.npz.

    Yields (memmap, path it has on success). For an .npz the caller builds the archive
    with write_npz_staged and the staging file is removed.
    """
    if out_dir is not None:
        path = out_dir / "diff_src.npy"
    elif output and output != "-":
        destination = Path(output)
        path = destination.with_name(f".{destination.name}.diff_src.npy")
    else:
        raise BnbwdError("--stream writes diff_src through a file: give -o OUT.npz or --out-dir DIR")
    with memmap_npy(path, shape, dtype) as array:
        yield array, path


def write_npz_staged(path: Path, arrays: dict[str, np.ndarray], staged: dict[str, Path]) -> None:
    """An .npz (stored, zip64) from small arrays plus members copied from staged .npy files; atomic."""
    from bnbwd_cli.tensor_io import atomic_file

    try:
        with atomic_file(path) as stream, zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, array in arrays.items():
                if key in staged:
                    add_npy_to_zip(archive, key, staged[key])
                else:
                    add_array_to_zip(archive, key, array)
    finally:
        for staged_path in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(staged_path)
