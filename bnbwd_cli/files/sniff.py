"""Which reader a file needs, from its first bytes and its name; PyTorch pickles are refused, never unpickled.

A .pt/.pth file is a Python pickle (the zip form holds `archive/data.pkl`, the legacy form starts with pickle's
PROTO opcode): loading one runs arbitrary code, so bnbwd names it and says how to convert it instead.
"""

from __future__ import annotations

from pathlib import Path

from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.common import open_regular, reason

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
PICKLE_SUFFIXES = (".pt", ".pth")
SAFETENSORS_SUFFIX = ".safetensors"
KEYED_SUFFIXES = (".npz", SAFETENSORS_SUFFIX)  # FILE.npz:key, FILE.safetensors:key
HEAD_BYTES = 16

CONVERT_HINT = ("convert it in Python: safetensors.torch.save_file(tensors, 'x.safetensors') (keeps bf16), "
                "or np.savez('x.npz', **{k: t.numpy() for k, t in tensors.items()})")


def has_key(source: str) -> bool:
    """FILE.npz:key or FILE.safetensors:key: a name that says which member of an archive to read."""
    head, sep, key = source.rpartition(":")
    return bool(sep) and head.lower().endswith(KEYED_SUFFIXES) and bool(key)


def is_pickle_head(head: bytes) -> bool:
    """Pickle protocol 2-5 starts with PROTO (0x80) and the protocol number (legacy torch.save, plain pickles)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def refuse_pickle(what: str) -> BnbwdError:
    return BnbwdError(f"{what}: is a PyTorch checkpoint (a Python pickle), which bnbwd never loads "
                      f"(unpickling runs code); {CONVERT_HINT}")


def _is_torch_zip(path: Path) -> bool:
    import zipfile  # only for files that start as a zip: a run on .npy files never loads it (files/npz.py)

    try:
        with zipfile.ZipFile(path) as archive:
            return any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, NotImplementedError):
        return False  # not readable as a zip: the .npz reader gives the precise error


def looks_like_safetensors(head: bytes) -> bool:
    """8-byte little-endian header size, then the JSON header's '{'."""
    return len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1


def file_kind(path: Path, what: str) -> str:
    """'npy', 'npz' or 'safetensors' for a regular file; a PyTorch pickle (by name or content) is an error."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise refuse_pickle(what)
    try:
        with open_regular(path, what) as stream:
            head = stream.read(HEAD_BYTES)
    except OSError as exc:
        raise BnbwdError(f"{what}: cannot read ({reason(exc)})") from None
    if is_pickle_head(head):
        raise refuse_pickle(what)
    if head[:4] in ZIP_MAGICS:
        if _is_torch_zip(path):
            raise refuse_pickle(what)
        return "npz"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if path.suffix.lower() == SAFETENSORS_SUFFIX or looks_like_safetensors(head):
        return "safetensors"
    return "npy"  # the .npy reader says precisely what is wrong with it
