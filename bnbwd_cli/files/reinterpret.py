"""--bf16 KEY: 2-byte integer data (PyTorch's bf16 dumped as int16/uint16 bits, or raw |V2) read as bfloat16.

NumPy has no bfloat16 of its own, so bf16 tensors often leave PyTorch as `t.view(torch.int16).numpy()`;
the bits are the value, and a view (no copy, no rounding) gives it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

from bnbwd_cli import dtypes
from bnbwd_cli.errors import BnbwdError


def _is_raw16(array) -> bool:  # an ndarray or files.blocks.NpyBlocks
    return array.dtype.itemsize == 2 and array.dtype.kind in "uiV"


def reinterpret_bf16(keys: Iterable[str], sets: Mapping[str, MutableMapping]) -> set[str]:
    """In every set (label -> arrays by key) holding a KEY, 2-byte integer data becomes bfloat16, in place.

    Returns the keys found in some set. A KEY found only with another dtype (say float32) is an error: the
    flag would otherwise do nothing silently. A KEY already bfloat16 is left as it is.
    """
    found = set()
    for key in keys:
        holders = {label: arrays[key] for label, arrays in sets.items() if key in arrays}
        if not holders:
            continue
        found.add(key)
        raw = [label for label, array in holders.items() if _is_raw16(array)]
        if not raw and not any(dtypes.is_bfloat16(array.dtype) for array in holders.values()):
            label, array = next(iter(holders.items()))
            raise BnbwdError(f"--bf16 {key}: {key} has dtype {array.dtype} (in {label}), expected 2-byte raw data "
                             "(int16, uint16 or V2 holding bfloat16 bits)")
        for label in raw:
            sets[label][key] = sets[label][key].view(dtypes.BFLOAT16)
    return found


def check_found(keys: Iterable[str], found: set[str], where: str) -> None:
    """A --bf16 KEY that names no array read is an error (a typo must not pass silently); every such KEY in the one
    error, so that one more run fixes them all."""
    missing = list(dict.fromkeys(key for key in keys if key not in found))
    if len(missing) == 1:
        raise BnbwdError(f"--bf16 {missing[0]}: no array named {missing[0]!r} in {where}")
    if missing:
        raise BnbwdError(f"{' '.join(f'--bf16 {key}' for key in missing)}: no arrays named "
                         f"{', '.join(map(repr, missing))} in {where}")
