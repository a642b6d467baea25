"""The fast read and write paths of the files layer keep its promises: a stored .npz member read straight into its
array (files/stored.read_stored) has its CRC-32 checked over every chunk and every byte after the array, a member
cut short is a clean error, archives from pipes and stdin read the same; the .npz writer (files/encode.save_npz)
writes byte for byte what np.savez writes, and the --out-dir writer what np.save writes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files import npz
from bnbwd_cli.files.npy import READ_CHUNK
from bnbwd_cli.files.read import read_array, read_bundle
from bnbwd_cli.files.write import npz_bytes, write_npy_dir, write_npz
from tests.conftest import assert_one_error, make_inputs, npz_archive, save_bundle

NCHW = ("--epsilon", "1e-3", "--format", "NCHW")
BIG = (3, 1000, 301)  # 3.6 MB of float32: several read chunks and a partial last one
assert np.prod(BIG) * 4 > 3 * READ_CHUNK


def member_data_start(path: Path, name: str) -> tuple[int, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    local = path.read_bytes()[info.header_offset : info.header_offset + 30]
    return info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little"), info


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def big(rng) -> np.ndarray:
    return rng.standard_normal(BIG).astype(np.float32)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_stored_member_read_by_chunks_checks_its_crc_everywhere(tmp_path, big, where):
    path = tmp_path / "x.npz"
    np.savez(path, x=big)
    assert np.array_equal(read_array(f"{path}:x", "x"), big)
    start, info = member_data_start(path, "x.npy")
    at = {"first": start + 200, "middle": start + info.file_size // 2, "last": start + info.file_size - 1}[where]
    flip(path, at)
    with pytest.raises(BnbwdError, match=r"x \(.*:x\): cannot read x\.npy \(Bad CRC-32 for file 'x\.npy'\)"):
        read_array(f"{path}:x", "x")


def test_corrupted_stored_member_is_exit_3_through_the_cli(cli, tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 64, 64))
    path = Path(save_bundle(tmp_path / "b.npz", arrays))
    start, info = member_data_start(path, "diff_dst.npy")
    flip(path, start + info.file_size - 3)
    assert_one_error(cli("run", path, *NCHW, "-q", "-o", tmp_path / "out.npz"),
                     r"diff_dst.*cannot read diff_dst\.npy \(Bad CRC-32")
    assert not (tmp_path / "out.npz").exists()


def test_bytes_after_the_array_are_crc_checked_too(tmp_path, big):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as archive, archive.open("x.npy", "w") as member:
        np.lib.format.write_array(member, big)
        member.write(b"trailing bytes np.save never writes" * 100)
    assert np.array_equal(read_array(f"{path}:x", "x"), big)
    start, info = member_data_start(path, "x.npy")
    flip(path, start + info.file_size - 5)
    with pytest.raises(BnbwdError, match="Bad CRC-32"):
        read_array(f"{path}:x", "x")


@pytest.mark.parametrize("cut", ["in the array", "after the array"])
def test_member_cut_short_while_read_is_a_clean_error(tmp_path, big, cut):
    """The archive shrinks between its directory being read and its data (a file rewritten mid-read): an error
    naming the member, never SIGBUS (nothing is mapped) and never a short array."""
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as archive, archive.open("x.npy", "w") as member:
        np.lib.format.write_array(member, big)
        member.write(b"\0" * 1000)
    start, info = member_data_start(path, "x.npy")
    keep = start + (info.file_size // 2 if cut == "in the array" else info.file_size - 500)
    with npz.open_zip(path, "x") as archive:
        os.truncate(path, keep)
        with pytest.raises(BnbwdError, match=r"x: cannot read x\.npy \(the archive ends inside the member: truncated\)"):
            npz._read_member(archive, archive.getinfo("x.npy"), "x")


def test_local_header_must_name_the_member(tmp_path, big):
    path = tmp_path / "x.npz"
    np.savez(path, x=big)
    with zipfile.ZipFile(path) as archive:
        offset = archive.getinfo("x.npy").header_offset
    data = bytearray(path.read_bytes())
    data[offset + 30] = ord("y")  # the local header now names y.npy; the central directory still says x.npy
    path.write_bytes(bytes(data))
    with pytest.raises(BnbwdError, match=r"x \(.*\): cannot read x\.npy|not a valid"):
        read_array(f"{path}:x", "x")


def test_members_with_sizes_after_their_data_read_alike(tmp_path, big):
    """zipfile writes to a pipe with the sizes after each member (flag bit 3): the data start is found the same."""
    path = tmp_path / "piped.npz"
    path.write_bytes(npz_archive({"x": big, "y": big[0, :7]}, stream=True))
    read = read_bundle(str(path))
    assert np.array_equal(read["x"], big) and np.array_equal(read["y"], big[0, :7])


def test_deflated_member_by_chunks_round_trips_and_checks_its_crc(tmp_path, big):
    path = tmp_path / "x.npz"
    np.savez_compressed(path, x=big, small=big[0, 0])
    read = read_bundle(str(path))
    assert np.array_equal(read["x"], big) and np.array_equal(read["small"], big[0, 0])


@pytest.mark.parametrize("spool_memory", [1 << 30, 1 << 16], ids=["spooled-in-memory", "spooled-to-a-file"])
def test_stored_archive_from_a_pipe_reads_the_same(tmp_path, big, monkeypatch, spool_memory):
    monkeypatch.setattr(npz, "SPOOL_MEMORY", spool_memory)
    data = npz_bytes({"x": big, "y": big[1]})
    with npz.spool_archive(io.BytesIO(data), "pipe") as spool:
        read = npz.read_npz(spool, "pipe")
    assert np.array_equal(read["x"], big) and np.array_equal(read["y"], big[1])
    damaged = bytearray(data)
    damaged[len(data) // 3] ^= 0xFF
    with npz.spool_archive(io.BytesIO(bytes(damaged)), "pipe") as spool:
        with pytest.raises(BnbwdError, match="Bad CRC-32"):
            npz.read_npz(spool, "pipe")


def open_fifo_writer(fifo: Path, reader: subprocess.Popen) -> int:
    """The FIFO's write end, once the reader has opened it (never a test blocked on a reader that died first)."""
    import errno
    import fcntl
    import time

    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or reader.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd


def test_stdin_and_fifo_archives_through_the_cli(tmp_path, rng):
    arrays = make_inputs(rng, (2, 3, 64, 64))
    bundle = Path(save_bundle(tmp_path / "b.npz", arrays))
    run = [sys.executable, "-m", "bnbwd_cli", "run", *NCHW, "-q"]
    from_file = subprocess.run([*run, str(bundle), "-o", str(tmp_path / "file.npz")], capture_output=True)
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = subprocess.run([*run, "-", "-o", str(tmp_path / "stdin.npz")], input=bundle.read_bytes(),
                                capture_output=True)
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert (tmp_path / "stdin.npz").read_bytes() == (tmp_path / "file.npz").read_bytes()
    start, info = member_data_start(bundle, "src.npy")
    flip(bundle, start + info.file_size - 1)
    fifo = tmp_path / "in.npz"
    os.mkfifo(fifo)
    child = subprocess.Popen([*run, str(fifo), "-o", str(tmp_path / "fifo.npz")], stderr=subprocess.PIPE)
    with os.fdopen(open_fifo_writer(fifo, child), "wb") as writer:
        writer.write(bundle.read_bytes())
    stderr = child.communicate(timeout=60)[1].decode()
    assert child.returncode == 3 and "Bad CRC-32" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "fifo.npz").exists()


def writer_catalogue(rng) -> dict[str, np.ndarray]:
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    return {"f32": a, "f16": a.astype(np.float16), "bf16": a.astype(ml_dtypes.bfloat16), "f64": a.astype(np.float64),
            "big_endian": a.astype(">f4"), "fortran": np.asfortranarray(a), "transposed": a.T, "strided": a[:, ::2],
            "scalar": np.float32(3).reshape(()), "empty": np.zeros((0, 4), np.float32), "ints": np.arange(5),
            "several_chunks": rng.standard_normal(BIG).astype(np.float32)}


def test_npz_writer_writes_what_np_savez_writes(tmp_path, rng):
    arrays = writer_catalogue(rng)
    expected = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whatever NumPy says about bfloat16's descr, the bytes are compared
        np.savez(expected, **arrays)
    assert npz_bytes(arrays) == expected.getvalue()
    write_npz(tmp_path / "out.npz", arrays)
    assert (tmp_path / "out.npz").read_bytes() == expected.getvalue()
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]  # no temp file left


def test_npy_dir_writer_writes_what_np_save_writes(tmp_path, rng):
    arrays = writer_catalogue(rng)
    (tmp_path / "out").mkdir()
    write_npy_dir(tmp_path / "out", arrays)
    for key, array in arrays.items():
        expected = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.save(expected, array, allow_pickle=False)
        assert (tmp_path / "out" / f"{key}.npy").read_bytes() == expected.getvalue(), key
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"{key}.npy" for key in arrays)


# ---------------------------------------------------------------- putting an output in place (files/swap.py)


def test_replacing_an_existing_output_exchanges_the_names_then_removes_the_old(tmp_path, monkeypatch):
    from bnbwd_cli.files import swap

    if swap._renameat2() is None:
        pytest.skip("no renameat2 here: os.replace does the job")
    target, temp, other_link = tmp_path / "out.npz", tmp_path / ".out.npz.1234.tmp", tmp_path / "other"
    target.write_bytes(b"old")
    os.link(target, other_link)
    temp.write_bytes(b"new")
    monkeypatch.setattr(swap.os, "replace", lambda *a: pytest.fail("os.replace used where the exchange works"))
    swap.replace(temp, target)
    assert target.read_bytes() == b"new" and other_link.read_bytes() == b"old"  # the old inode kept only by its link
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out.npz"]


@pytest.mark.parametrize("kind", ["missing", "symlink", "directory"])
def test_targets_that_are_not_regular_files_are_replaced_as_os_replace_does(tmp_path, kind):
    from bnbwd_cli.files import swap

    target, temp, pointed = tmp_path / "out.npz", tmp_path / "temp", tmp_path / "pointed"
    temp.write_bytes(b"new")
    pointed.write_bytes(b"kept")
    if kind == "symlink":
        target.symlink_to(pointed)
    if kind == "directory":
        target.mkdir()
        with pytest.raises(IsADirectoryError):
            swap.replace(temp, target)
        assert target.is_dir() and temp.read_bytes() == b"new"
        return
    swap.replace(temp, target)
    assert not target.is_symlink() and target.read_bytes() == b"new" and pointed.read_bytes() == b"kept"
    assert not temp.exists()


def test_rewriting_an_output_through_the_cli_leaves_only_the_new_one(cli, tmp_path, rng):
    bundle = save_bundle(tmp_path / "b.npz", make_inputs(rng, (2, 3, 4, 5)))
    out = tmp_path / "out" / "grads.npz"
    out.parent.mkdir()
    out.write_bytes(b"an old output")
    assert cli("run", bundle, *NCHW, "-q", "-o", out).exit_code == 0
    with np.load(out) as archive:
        assert sorted(archive.files) == ["diff_beta", "diff_gamma", "diff_src"]
    assert [p.name for p in out.parent.iterdir()] == ["grads.npz"]
