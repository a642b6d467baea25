"""Which arrays are compared with which: key matching, and what makes a pair incomparable."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bnbwd_cli.dtypes import dtype_name


@dataclass(frozen=True)
class Pairing:
    """An actual key and the reference key it is compared with."""

    actual_key: str
    reference_key: str

    @property
    def name(self) -> str:
        """Report name: the reference key, or ``actual=reference`` when they differ."""
        if self.actual_key == self.reference_key:
            return self.reference_key
        return f"{self.actual_key}={self.reference_key}"

    @property
    def names(self) -> tuple[str, str]:
        """Names a per-output override may use (actual key first)."""
        return (self.actual_key, self.reference_key)


@dataclass(frozen=True)
class Problem:
    """A structural failure: kind is "missing", "extra", "shape", "dtype" or "empty"."""

    kind: str
    name: str
    message: str


@dataclass(frozen=True)
class KeyMatch:
    pairs: tuple[Pairing, ...]
    problems: tuple[Problem, ...]


def match_keys(
    actual_keys: Sequence[str],
    reference_keys: Sequence[str],
    key_map: Mapping[str, str] | None = None,
    only: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> KeyMatch:
    """Pair actual keys with reference keys (by name; ``key_map`` maps actual -> reference).

    ``only``/``ignore`` select by either key. A reference key without an actual partner is
    "missing", an unpaired actual key is "extra": both are structural failures.
    Order follows the reference.
    """
    key_map = dict(key_map or {})
    only, ignore = set(only), set(ignore)
    problems: list[Problem] = []
    for a_key, r_key in key_map.items():
        if a_key not in actual_keys:
            problems.append(Problem("missing", a_key, f"--map {a_key}={r_key}: actual has no key {a_key!r}"))
        if r_key not in reference_keys:
            problems.append(Problem("missing", r_key, f"--map {a_key}={r_key}: reference has no key {r_key!r}"))
    unknown = sorted(only - set(actual_keys) - set(reference_keys) - set(key_map))
    for name in unknown:
        problems.append(Problem("missing", name, f"--only {name}: no such key in actual or reference"))

    def selected(*names: str) -> bool:
        return (not only or any(n in only for n in names)) and not any(n in ignore for n in names)

    reverse = {r: a for a, r in key_map.items()}
    pairs: list[Pairing] = []
    paired_actual: set[str] = set()
    for r_key in reference_keys:
        a_key = reverse.get(r_key, r_key)
        if not selected(a_key, r_key):
            continue
        if a_key in actual_keys:
            pairs.append(Pairing(a_key, r_key))
            paired_actual.add(a_key)
        else:
            problems.append(Problem("missing", r_key, f"{r_key}: in reference, missing from actual"))
    for a_key in actual_keys:
        r_key = key_map.get(a_key, a_key)
        if a_key not in paired_actual and selected(a_key, r_key) and not (a_key in key_map and r_key not in reference_keys):
            problems.append(Problem("extra", a_key, f"{a_key}: in actual, missing from reference"))
    if not pairs and not problems:
        problems.append(Problem("empty", "", "nothing to compare: no keys selected"))
    return KeyMatch(tuple(pairs), tuple(problems))


_LAYOUT_NAMES = {3: ("NCW", "NWC"), 4: ("NCHW", "NHWC"), 5: ("NCDHW", "NDHWC")}


def permutation_hint(actual_shape: Sequence[int], reference_shape: Sequence[int]) -> str | None:
    """Say which axis permutation would make the shapes agree (never applied), if any."""
    a, r = tuple(actual_shape), tuple(reference_shape)
    if len(a) != len(r) or sorted(a) != sorted(r):
        if math.prod(a) == math.prod(r):
            return f"same number of elements ({math.prod(a)}): a reshape, not a transpose, would make them agree"
        return None
    ndim = len(r)
    if ndim in _LAYOUT_NAMES:
        ncx, nxc = _LAYOUT_NAMES[ndim]
        to_nxc = (0, *range(2, ndim), 1)
        to_ncx = (0, ndim - 1, *range(1, ndim - 1))
        if a == tuple(r[i] for i in to_nxc):
            return f"actual looks like the {nxc} transpose of reference ({ncx}); bnbwd never transposes: convert one side"
        if a == tuple(r[i] for i in to_ncx):
            return f"actual looks like the {ncx} transpose of reference ({nxc}); bnbwd never transposes: convert one side"
    if ndim <= 6:
        for perm in itertools.permutations(range(ndim)):
            if a == tuple(r[i] for i in perm):
                return f"actual looks like reference transposed with axes {perm}; bnbwd never transposes"
    return None


def structural_problem(name: str, actual: np.ndarray, reference: np.ndarray) -> Problem | None:
    """A reason the pair cannot be compared (dtype, shape), or None."""
    for side, array in (("actual", actual), ("reference", reference)):
        if dtype_name(array.dtype) is None:
            return Problem(
                "dtype", name, f"{name}: {side} has dtype {array.dtype}, which cannot be compared (expected f64, f32, f16 or bf16)"
            )
    if actual.shape != reference.shape:
        hint = permutation_hint(actual.shape, reference.shape)
        message = f"{name}: actual has shape {tuple(actual.shape)}, reference {tuple(reference.shape)}"
        return Problem("shape", name, f"{message}; {hint}" if hint else message)
    return None
