"""Every file guard at its limit and one step past it, through the real CLI: at the limit the file is read (exit 0),
one byte, dimension or item past it the command exits 3 with the guard's one line. Then what a killed run leaves
(stale temp files, never taken for outputs) and a failure on the last output of a set (nothing committed)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.files import npz as npz_module
from bnbwd_cli.files import raw as raw_module
from tests.conftest import ROOT, assert_one_error, make_inputs, npz_archive, save_bundle

OUTPUTS = ("diff_src", "diff_gamma", "diff_beta")
# The limits themselves, written out (not read from the modules): a limit moved is a behaviour changed.
RAW_DIMENSIONS = SAFETENSORS_DIMENSIONS = 32
DEFLATE_RATIO, RATIO_SLACK = 1100, 4096  # a member may declare up to ratio * compressed + slack bytes
LZMA_DICTIONARY = 64 << 20
CENTRAL_BYTES = 16 << 20  # after a streamed archive's last member
HEADER_BYTES = 8 << 20  # a .safetensors header
JSON_ITEMS = 1 << 18  # brackets and commas in a .safetensors header


@pytest.fixture
def case(tmp_path: Path, rng, cli) -> Path:
    """inputs.npz and ref/ (bnbwd's outputs as .npy files) in tmp_path."""
    arrays = make_inputs(rng, (2, 3, 4, 4), "NCX")
    save_bundle(tmp_path / "inputs.npz", arrays, epsilon=1e-5, data_format="NCHW")
    result = cli("run", tmp_path / "inputs.npz", "-q", "--out-dir", tmp_path / "ref")
    assert result.exit_code == 0, result.output
    return tmp_path


def _outputs(case: Path) -> dict[str, np.ndarray]:
    return {name: np.load(case / "ref" / f"{name}.npy") for name in OUTPUTS}


def _compared(result) -> list[str]:
    return [row["name"] for row in json.loads(result.stdout)["outputs"]]


# ---------------------------------------------------------------- .npy: the data its header declares


def test_npy_holding_exactly_its_declared_data_is_read_one_byte_short_is_refused(cli, case: Path) -> None:
    kernel = case / "k" / "diff_src.npy"
    kernel.parent.mkdir()
    shutil.copy(case / "ref" / "diff_src.npy", kernel)
    assert cli("verify", kernel, case / "ref" / "diff_src.npy").exit_code == 0
    data = kernel.read_bytes()
    kernel.write_bytes(data[:-1])
    assert_one_error(cli("verify", kernel, case / "ref" / "diff_src.npy"),
                     r"header declares shape \(2, 3, 4, 4\) float32 \(384 bytes\) but the file holds 383 bytes of data")


# ---------------------------------------------------------------- raw dumps: size, dimensions, bytes


@pytest.mark.parametrize("delta", [0, -1, 1])
def test_raw_dump_size_must_match_its_shape_to_the_byte(cli, case: Path, delta: int) -> None:
    reference = _outputs(case)["diff_src"]
    for side in ("k", "r"):
        (case / side).mkdir()
        (case / side / "diff_src.bin").write_bytes(reference.tobytes())
    kernel = case / "k" / "diff_src.bin"
    data = reference.tobytes()
    kernel.write_bytes(data[: len(data) + delta] if delta < 0 else data + bytes(delta))
    result = cli("verify", f"raw:f32:2x3x4x4:{kernel}", f"raw:f32:2x3x4x4:{case / 'r' / 'diff_src.bin'}")
    if delta == 0:
        assert result.exit_code == 0, result.output
    else:
        assert_one_error(result, rf"needs 384 bytes, the file holds {384 + delta}")


@pytest.mark.parametrize("dimensions", [RAW_DIMENSIONS, RAW_DIMENSIONS + 1])
def test_raw_dimensions_at_the_limit_and_one_past(cli, tmp_path: Path, dimensions: int) -> None:
    data = tmp_path / "t.bin"
    data.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    shape = "x".join(["1"] * (dimensions - 1) + ["4"])
    result = cli("verify", f"raw:f32:{shape}:{data}", f"raw:f32:{shape}:{data}")
    if dimensions <= RAW_DIMENSIONS:
        assert result.exit_code == 0, result.output
    else:
        assert_one_error(result, rf"shape has {dimensions} dimensions, at most {RAW_DIMENSIONS} are read")


@pytest.mark.parametrize("elements, pattern", [
    ((1 << 60) - 1, rf"needs {((1 << 60) - 1) * 4} bytes, the file holds 4"),  # a size a file could have
    (1 << 60, "describes more bytes than any file holds"),  # 2**62 bytes of f32
])
def test_raw_byte_bound_at_the_limit_and_one_past(cli, tmp_path: Path, elements: int, pattern: str) -> None:
    data = tmp_path / "t.bin"
    data.write_bytes(bytes(4))
    assert_one_error(cli("verify", f"raw:f32:{elements}:{data}", f"raw:f32:1:{data}"), pattern)


def test_raw_dump_at_the_memory_cap_is_read_one_byte_over_is_refused(cli, case: Path, monkeypatch) -> None:
    reference = _outputs(case)["diff_beta"]
    path = case / "diff_beta.bin"
    path.write_bytes(reference.tobytes())
    source = f"raw:f32:3:{path}"
    monkeypatch.setattr(raw_module, "memory_cap", lambda: reference.nbytes)
    assert cli("verify", source, case / "ref" / "diff_beta.npy").exit_code == 0
    monkeypatch.setattr(raw_module, "memory_cap", lambda: reference.nbytes - 1)
    assert_one_error(cli("verify", source, case / "ref" / "diff_beta.npy"), r"12 bytes, more than the memory available")


# ---------------------------------------------------------------- .npz: sizes, the ratio bound, the archive itself


def _member_offsets(data: bytes, name: bytes) -> tuple[int, int]:
    """(local header, central directory entry) offsets of the member named `name`."""
    central = data.index(b"PK\x01\x02")
    while data[central + 46 : central + 46 + int.from_bytes(data[central + 28 : central + 30], "little")] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    return int.from_bytes(data[central + 42 : central + 46], "little"), central


def _declare_size(data: bytes, name: bytes, size: int) -> bytes:
    """The archive with member `name`'s uncompressed size set to `size` in its local header and the directory."""
    local, central = _member_offsets(data, name)
    edited = bytearray(data)
    struct.pack_into("<I", edited, local + 22, size)
    struct.pack_into("<I", edited, central + 24, size)
    return bytes(edited)


def _compressed_size(data: bytes, name: bytes) -> int:
    _, central = _member_offsets(data, name)
    return int.from_bytes(data[central + 20 : central + 24], "little")


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_stored_member_declaring_one_byte_more_or_less_than_it_holds_is_refused(cli, case: Path, delta: int) -> None:
    kernel = case / "k.npz"
    archive = npz_archive(_outputs(case))
    kernel.write_bytes(archive)
    assert cli("verify", kernel, case / "ref").exit_code == 0
    held = _compressed_size(archive, b"diff_gamma.npy")
    kernel.write_bytes(_declare_size(archive, b"diff_gamma.npy", held + delta))
    assert_one_error(cli("verify", kernel, case / "ref"),
                     rf"stored member declares {held + delta} bytes but holds {held} \(truncated, or its size is a lie\)")


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA],
                         ids=["deflate", "bzip2", "lzma"])
def test_the_compression_ratio_bound_just_under_and_just_over(cli, case: Path, method: int) -> None:
    """A member may declare up to 1100 times its compressed size plus 4096 bytes: at that exactly it is
    read (its .npy header says how much data to take), one byte more is refused before anything is inflated."""
    outputs = _outputs(case)
    archive = npz_archive(outputs, method)
    bound = DEFLATE_RATIO * _compressed_size(archive, b"diff_src.npy") + RATIO_SLACK
    kernel = case / "k.npz"
    kernel.write_bytes(_declare_size(archive, b"diff_src.npy", bound))
    at_bound = cli("verify", kernel, case / "ref", "--json", "-")
    assert at_bound.exit_code == 0, at_bound.output
    assert sorted(_compared(at_bound)) == sorted(OUTPUTS)
    kernel.write_bytes(_declare_size(archive, b"diff_src.npy", bound + 1))
    name = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}[method]
    assert_one_error(cli("verify", kernel, case / "ref"),
                     rf"k\.npz:diff_src: {name} member declares {bound + 1} bytes from \d+ compressed, more than deflate")


def _lzma_dictionary(data: bytes, name: bytes, size: int) -> bytes:
    """The archive with lzma member `name`'s declared dictionary size set to `size` (its properties' bytes 1-4)."""
    local, _ = _member_offsets(data, name)
    name_length, extra_length = struct.unpack_from("<HH", data, local + 26)
    properties = local + 30 + name_length + extra_length + 4  # after the 2-byte version and 2-byte length
    edited = bytearray(data)
    struct.pack_into("<I", edited, properties + 1, size)
    return bytes(edited)


def test_the_lzma_dictionary_bound_at_the_limit_and_one_past(cli, case: Path) -> None:
    archive = npz_archive(_outputs(case), zipfile.ZIP_LZMA)
    kernel = case / "k.npz"
    kernel.write_bytes(_lzma_dictionary(archive, b"diff_beta.npy", LZMA_DICTIONARY))
    assert cli("verify", kernel, case / "ref").exit_code == 0
    kernel.write_bytes(_lzma_dictionary(archive, b"diff_beta.npy", LZMA_DICTIONARY + 1))
    assert_one_error(cli("verify", kernel, case / "ref"),
                     rf"lzma member asks for a dictionary over {LZMA_DICTIONARY} bytes")


def test_an_npz_one_byte_short_is_refused(cli, case: Path) -> None:
    kernel = case / "k.npz"
    kernel.write_bytes(npz_archive(_outputs(case))[:-1])
    assert_one_error(cli("verify", kernel, case / "ref"), r"k\.npz: not a valid \.npz archive")
    assert_one_error(cli("run", kernel, "-q"), r"not a valid \.npz archive")


def test_a_bundle_at_the_memory_cap_is_read_one_byte_over_is_refused(cli, case: Path, monkeypatch) -> None:
    from bnbwd_cli.files import common

    with np.load(case / "inputs.npz") as bundle:
        total = sum(bundle[key].nbytes for key in bundle.files)
    monkeypatch.setattr(common, "memory_cap", lambda: total)
    assert cli("run", case / "inputs.npz", "-q", "-o", case / "o.npz").exit_code == 0
    monkeypatch.setattr(common, "memory_cap", lambda: total - 1)
    assert_one_error(cli("run", case / "inputs.npz", "-q", "-o", case / "o2.npz"),
                     rf"its arrays declare {total} bytes, more than the memory available")


def test_what_follows_a_streamed_archives_last_member_is_capped_to_the_byte() -> None:
    """From the central directory's first byte, 16 MiB may follow (in any chunks), one more is refused."""
    from bnbwd_cli.errors import BnbwdError

    headers = npz_module.LocalHeaders("stdin")
    headers.feed(b"PK\x01\x02")
    headers.feed(bytes(CENTRAL_BYTES - 4))
    with pytest.raises(BnbwdError, match=rf"more than {CENTRAL_BYTES} bytes after its last member"):
        headers.feed(b"\0")


def test_a_streamed_archive_one_byte_past_the_central_cap_is_refused(cli, case: Path) -> None:
    arrays = dict(np.load(case / "inputs.npz"))
    archive = npz_archive(arrays)
    central = archive.index(b"PK\x01\x02")
    tail = archive[central:]
    stdin = archive + bytes(CENTRAL_BYTES - len(tail) + 1)
    assert_one_error(cli("run", "-", "-q", "-o", case / "o.npz", input=stdin),
                     rf"more than {CENTRAL_BYTES} bytes after its last member")
    assert cli("run", "-", "-q", "-o", case / "o.npz", input=archive).exit_code == 0


# ---------------------------------------------------------------- .safetensors: the header's bounds


SAFETENSORS_TYPES = {np.dtype(np.float32): "F32"}


def _safetensors(tensors: dict[str, np.ndarray], *, header_bytes: int | None = None, items: int | None = None,
                 shapes: dict[str, list[int]] | None = None) -> bytes:
    """A .safetensors file of `tensors`; `header_bytes`: its header padded with spaces to that length; `items`: a
    __metadata__ string of commas making the header's count of brackets and commas exactly that; `shapes`: the
    declared shapes (the data as the arrays hold it)."""
    header, data, offset = {}, b"", 0
    for key, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        shape = (shapes or {}).get(key, list(array.shape))
        header[key] = {"dtype": SAFETENSORS_TYPES[array.dtype], "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    if items is not None:
        header = {"__metadata__": {"pad": ""}, **header}
        text = json.dumps(header).encode()
        count = text.count(b"{") + text.count(b"[") + text.count(b",")
        header["__metadata__"]["pad"] = "," * (items - count)
    text = json.dumps(header).encode()
    if header_bytes is not None:
        text += b" " * (header_bytes - len(text))
    return struct.pack("<Q", len(text)) + text + data


def _verify_safetensors(cli, case: Path, content: bytes, name: str = "k.safetensors"):
    path = case / name
    path.write_bytes(content)
    return cli("verify", path, case / "ref")


@pytest.mark.parametrize("excess", [0, 1])
def test_safetensors_header_cap_at_the_limit_and_one_past(cli, case: Path, excess: int) -> None:
    content = _safetensors(_outputs(case), header_bytes=HEADER_BYTES + excess)
    result = _verify_safetensors(cli, case, content)
    if not excess:
        assert result.exit_code == 0, result.output
    else:
        assert_one_error(result, rf"its header is {HEADER_BYTES + 1} bytes, more than the "
                                 rf"{HEADER_BYTES} bnbwd reads")


@pytest.mark.parametrize("excess", [0, 1])
def test_safetensors_json_items_at_the_limit_and_one_past(cli, case: Path, excess: int) -> None:
    content = _safetensors(_outputs(case), items=JSON_ITEMS + excess)
    result = _verify_safetensors(cli, case, content)
    if not excess:
        assert result.exit_code == 0, result.output
    else:
        assert_one_error(result, rf"its header holds more than {JSON_ITEMS} JSON values")


def test_safetensors_header_length_one_past_the_file_is_refused(cli, case: Path) -> None:
    content = _safetensors(_outputs(case))
    length = struct.unpack_from("<Q", content)[0]
    data_bytes = len(content) - 8 - length
    assert _verify_safetensors(cli, case, content).exit_code == 0
    whole = struct.pack("<Q", length + data_bytes) + content[8:]  # the header runs to the file's last byte
    result = _verify_safetensors(cli, case, whole)
    assert result.exit_code == 3 and "header length" not in result.stderr, result.stderr
    past = struct.pack("<Q", length + data_bytes + 1) + content[8:]
    assert_one_error(_verify_safetensors(cli, case, past),
                     rf"not a valid \.safetensors file \(header length {length + data_bytes + 1} in a {len(content)}-byte file\)")


@pytest.mark.parametrize("dimensions", [SAFETENSORS_DIMENSIONS, SAFETENSORS_DIMENSIONS + 1])
def test_safetensors_dimensions_at_the_limit_and_one_past(cli, case: Path, dimensions: int) -> None:
    # (the header declares the shape: NumPy 1.x holds no array of more than 32 dimensions to write it from)
    path = case / "t.safetensors"
    path.write_bytes(_safetensors({"t": np.arange(4, dtype=np.float32)}, shapes={"t": [1] * (dimensions - 1) + [4]}))
    result = cli("verify", path, path)
    if dimensions <= SAFETENSORS_DIMENSIONS:
        assert result.exit_code == 0, result.output
    else:
        assert_one_error(result, rf"tensor 't' has shape \[1, .*expected a list of at most {SAFETENSORS_DIMENSIONS}")


@pytest.mark.parametrize("elements, pattern", [
    ((1 << 62) - 1, r"declares shape \(4611686018427387903,\) F32 \(\d+ bytes\) but 4 bytes of data"),
    (1 << 62, r"has shape \[4611686018427387904\], expected a list of at most 32 integers"),
])
def test_safetensors_element_bound_at_the_limit_and_one_past(cli, tmp_path: Path, elements: int, pattern: str) -> None:
    path = tmp_path / "t.safetensors"
    path.write_bytes(_safetensors({"t": np.zeros(1, np.float32)}, shapes={"t": [elements]}))
    assert_one_error(cli("verify", path, path), pattern)


def test_a_safetensors_bundle_at_the_memory_cap_is_read_one_byte_over_is_refused(cli, case: Path, rng,
                                                                                  monkeypatch) -> None:
    from bnbwd_cli.files import safetensors_file

    arrays = make_inputs(rng, (2, 3, 4, 4), "NCX")
    path = case / "inputs.safetensors"
    path.write_bytes(_safetensors(arrays))
    total = sum(array.nbytes for array in arrays.values())
    run = ["run", path, "-q", "--epsilon", "1e-5", "--format", "NCHW", "-o"]
    monkeypatch.setattr(safetensors_file, "memory_cap", lambda: total)
    assert cli(*run, case / "o.npz").exit_code == 0
    monkeypatch.setattr(safetensors_file, "memory_cap", lambda: total - 1)
    assert_one_error(cli(*run, case / "o2.npz"), rf"its tensors declare {total} bytes, more than the memory available")


# ---------------------------------------------------------------- a killed run's temp files


KILLED_AT_RENAME = """
import os, signal, sys
from bnbwd_cli.files import swap
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
swap.replace = killed
from bnbwd_cli.cli import main
main(sys.argv[1:])
"""


def _killed_run(*args) -> int:
    """bnbwd killed by SIGKILL at its first rename: every output complete in its temp file, none committed."""
    done = subprocess.run([sys.executable, "-c", KILLED_AT_RENAME, *map(str, args)], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    return done.returncode


def test_stale_temp_files_of_a_killed_run_are_never_taken_for_outputs(cli, case: Path) -> None:
    out = case / "out"
    assert _killed_run("run", case / "inputs.npz", "-q", "--out-dir", out, "--json", out / "report.json") == -9
    stale = sorted(p.name for p in out.iterdir())
    assert len(stale) == 4 and all(n.startswith(".") and n.endswith(".tmp") for n in stale), stale
    assert_one_error(cli("verify", out, case / "ref"), r"out: directory holds no \.npy files")
    rerun = cli("run", case / "inputs.npz", "-q", "--out-dir", out)
    assert rerun.exit_code == 0, rerun.output
    result = cli("verify", out, case / "ref", "--json", "-")
    assert result.exit_code == 0 and sorted(_compared(result)) == sorted(OUTPUTS), result.output
    for name in OUTPUTS:
        assert np.array_equal(np.load(out / f"{name}.npy"), np.load(case / "ref" / f"{name}.npy"))


def test_a_stale_temp_beside_an_npz_output_is_not_read_as_it(cli, case: Path) -> None:
    assert _killed_run("run", case / "inputs.npz", "-q", "-o", case / "o.npz") == -9
    (temp,) = [p for p in case.iterdir() if p.name.startswith(".o.npz.")]
    assert_one_error(cli("verify", case / "o.npz", case / "ref"), r"o\.npz: no such file")
    assert cli("run", case / "inputs.npz", "-q", "-o", case / "o.npz").exit_code == 0
    assert temp.exists() and cli("verify", case / "o.npz", case / "ref").exit_code == 0


# ---------------------------------------------------------------- a failure on the last output of a set


def _full_disk_for(monkeypatch, name: str) -> list[Path]:
    """The temp file of the output named `name` written to /dev/full (ENOSPC on its first write); the temp paths
    made so far are returned (to check none is left)."""
    from bnbwd_cli.files import write

    original, made = write.create_temp, []

    def create_temp(path: Path):
        fd, temp = original(path)
        made.append(temp)
        if path.name == name:
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, temp

    monkeypatch.setattr(write, "create_temp", create_temp)
    return made


def test_a_full_disk_on_the_last_file_of_an_out_dir_commits_none(cli, case: Path, monkeypatch) -> None:
    out = case / "out"
    assert cli("run", case / "inputs.npz", "-q", "--out-dir", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    arrays = dict(np.load(case / "inputs.npz"))
    save_bundle(case / "other.npz", {**arrays, "diff_dst": -arrays["diff_dst"]})
    made = _full_disk_for(monkeypatch, "diff_beta.npy")
    result = cli("run", case / "other.npz", "-q", "--out-dir", out)
    assert_one_error(result, r"diff_beta\.npy: write failed \(No space left on device\); nothing was written")
    assert [p.name for p in made] and all(p.name.endswith(".tmp") for p in made) and len(made) == 3
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old set, whole; no temp left


def test_a_full_disk_while_writing_a_large_output_leaves_no_temp(cli, tmp_path: Path, rng, monkeypatch) -> None:
    """diff_src larger than the stream's buffer: its write meets the full disk inside the set (not at commit's
    flush), and the set still removes every temp file and leaves the old outputs whole."""
    arrays = make_inputs(rng, (2, 8, 32, 32), "NCX")  # a 64 KiB diff_src: written straight through the buffer
    save_bundle(tmp_path / "inputs.npz", arrays, epsilon=1e-5, data_format="NCHW")
    out = tmp_path / "out"
    assert cli("run", tmp_path / "inputs.npz", "-q", "--out-dir", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    save_bundle(tmp_path / "other.npz", {**arrays, "diff_dst": -arrays["diff_dst"]}, epsilon=1e-5, data_format="NCHW")
    made = _full_disk_for(monkeypatch, "diff_src.npy")
    result = cli("run", tmp_path / "other.npz", "-q", "--out-dir", out)
    assert_one_error(result, r"diff_src\.npy: write failed \(No space left on device\); nothing was written")
    assert made and not any(p.exists() for p in made)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_full_disk_on_the_json_report_after_the_outputs_commits_none(cli, case: Path, monkeypatch) -> None:
    made = _full_disk_for(monkeypatch, "report.json")
    result = cli("run", case / "inputs.npz", "-q", "--out-dir", case / "new" / "out", "--json", case / "report.json")
    assert_one_error(result, r"report\.json: write failed \(No space left on device\); nothing was written")
    assert made[-1].name.startswith(".report.json.")
    assert sorted(p.name for p in case.iterdir()) == ["inputs.npz", "ref"]  # no new/out, no temp
