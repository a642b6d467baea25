"""What bnbwd writes into a stream: .npy and .npz bytes, byte for byte what np.save and np.savez write, the
arrays' data handed over as slices of their own memory (no bytes copy of an array). Where the bytes go (temp
files, all or nothing, FIFOs) is files/write.py's concern.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format


def write_npy_header(stream: BinaryIO, header: dict) -> None:
    """A .npy header as np.save writes it: version 1.0 unless it does not fit in 1.0's 2-byte length."""
    if len(repr(header)) + 12 > 65535:
        npy_format.write_array_header_2_0(stream, header)
    else:
        npy_format.write_array_header_1_0(stream, header)


WRITE_CHUNK = 1 << 20  # a zip member CRCs each write while it is still in cache, then copies it out


def write_npy(stream: BinaryIO, array: np.ndarray) -> None:
    """`array` as a .npy, byte for byte what np.save writes, its data handed to `stream` as WRITE_CHUNK slices of
    the array's own memory: no bytes copy of the array (np.save's, for a stream that is not a file, is 16 MiB at a
    time, then CRC-checked and written from there)."""
    stored = array.T if array.flags.f_contiguous and not array.flags.c_contiguous else array  # Fortran: its C view
    if not stored.flags.c_contiguous or array.dtype.hasobject:
        npy_format.write_array(stream, array, allow_pickle=False)
        return
    write_npy_header(stream, npy_format.header_data_from_array_1_0(array))
    data = memoryview(stored.reshape(-1).view(np.uint8))
    for start in range(0, data.nbytes, WRITE_CHUNK):
        stream.write(data[start : start + WRITE_CHUNK])


def save_npz(stream: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Arrays as a stored .npz on `stream`, byte for byte what np.savez writes (bfloat16 as np.save stores it: |V2)."""
    import zipfile  # only here: a run writing .npy files never loads it (files/npz.py)

    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                write_npy(member, np.asanyarray(array))
