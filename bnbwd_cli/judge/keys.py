"""Which arrays are compared with which: key matching, and what makes a pair incomparable."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.dtypes import dtype_name
from bnbwd_cli.spec import is_input_key, suggest_key

if TYPE_CHECKING:
    from bnbwd_cli.judge.tolerance import Judging


@dataclass(frozen=True)
class Pairing:
    """An actual key and the reference key it is compared with."""

    actual_key: str
    reference_key: str
    canonical: str = ""  # the name both keys give (after --map and the specs' aliases)

    @property
    def name(self) -> str:
        """Report name: the reference key, or ``actual=reference`` when they differ."""
        if self.actual_key == self.reference_key:
            return self.reference_key
        return f"{self.actual_key}={self.reference_key}"

    @property
    def names(self) -> tuple[str, ...]:
        """Names a per-output override may use (actual key first, the canonical name last)."""
        return tuple(dict.fromkeys(n for n in (self.actual_key, self.reference_key, self.canonical) if n))


@dataclass(frozen=True)
class KeyProblem:
    """A structural failure: kind is "missing", "extra", "shape", "dtype" or "empty"."""

    kind: str
    name: str
    message: str


@dataclass(frozen=True)
class KeyMatch:
    pairs: tuple[Pairing, ...]
    problems: tuple[KeyProblem, ...]
    notes: tuple[str, ...] = ()


# Output names the specs use, mapped to ours (the scaled rule needs to know which output is which).
OUTPUT_ALIASES = {
    "diff_src": "diff_src", "diff_gamma": "diff_gamma", "diff_beta": "diff_beta",
    "input_delta": "diff_src", "gamma_delta": "diff_gamma", "beta_delta": "diff_beta",
    "x_backprop": "diff_src", "scale_backprop": "diff_gamma", "offset_backprop": "diff_beta",
    "grad_input": "diff_src", "grad_weight": "diff_gamma", "grad_bias": "diff_beta",
}


def canonical_key(key: str, key_map: Mapping[str, str]) -> str:
    """A file's key as bnbwd names it: ``--map THEIRS=OURS`` first, then the specs' output aliases.

    The map renames keys in every file it is given (kernel outputs, references and inputs alike), so
    THEIRS=OURS reads the same way in run, verify and check.
    """
    name = key_map.get(key, key)
    return OUTPUT_ALIASES.get(name, name)


def _named(keys: Sequence[str], key_map: Mapping[str, str], side: str, problems: list[KeyProblem]) -> dict[str, str]:
    """Canonical name -> the file's key; two keys giving one name is a problem (which one is meant?)."""
    named: dict[str, str] = {}
    for key in keys:
        name = canonical_key(key, key_map)
        if name in named:
            problems.append(KeyProblem("extra", key, f"{side} holds both {named[name]!r} and {key!r} as {name}; keep one"))
            continue
        named[name] = key
    return named


def _not_compared_note(inputs: Iterable[str], extras: Iterable[str], not_outputs: Iterable[str],
                       unused_map: Iterable[str]) -> tuple[str, ...]:
    """The keys left out, said once: inputs and attributes, keys only one side holds, --map entries that matched nothing."""
    parts = []
    for label, keys in (("the op's inputs", inputs), ("only in actual", extras), ("not outputs", not_outputs),
                        ("--map matched no key", unused_map)):
        keys = list(dict.fromkeys(keys))
        if keys:
            parts.append(f"{', '.join(keys)} ({label})")
    return (f"not compared: {'; '.join(parts)}",) if parts else ()


def match_keys(
    actual_keys: Sequence[str],
    reference_keys: Sequence[str],
    key_map: Mapping[str, str] | None = None,
    only: Iterable[str] = (),
    ignore: Iterable[str] = (),
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> KeyMatch:
    """Pair actual keys with reference keys by canonical name (``key_map``: THEIRS -> OURS, on both sides).

    ``only``/``ignore`` select by either key or the canonical name. When either side holds the op's
    outputs (diff_src... or a spec's name), only those are compared: the inputs and attributes a case
    dump holds next to them, and its other keys, are not (unless --only names them). Plain arrays are
    compared by name, except an input name only one side holds. A reference key to compare without an
    actual partner is "missing" (a structural failure); keys left out, actual keys the reference lacks
    and --map entries that match nothing are listed in one note. Order follows the reference. ``shapes`` (by
    key) let a missing key's message suggest the actual key that likely holds it (--map)."""
    key_map = dict(key_map or {})
    only, ignore = set(only), set(ignore)
    problems: list[KeyProblem] = []
    actual = _named(actual_keys, key_map, "actual", problems)
    reference = _named(reference_keys, key_map, "reference", problems)
    known = set(actual_keys) | set(reference_keys) | set(actual) | set(reference)
    for name in sorted(only - known - set(key_map.values())):
        problems.append(KeyProblem("missing", name, f"--only {name}: no such key in actual or reference"))

    def selected(*names: str) -> bool:
        return (not only or any(n in only for n in names)) and not any(n in ignore for n in names)

    # Files holding the op's outputs (case dumps): those outputs are what is compared, every other key (the
    # inputs, a step count) is noted, unless --only names it. Files of plain arrays: every key, by name.
    holds_outputs = any(name in OUTPUT_ALIASES.values() for name in [*reference, *actual])

    def set_aside(name: str) -> bool:  # the case's inputs, not an output
        return is_input_key(name) and (holds_outputs or name not in actual or name not in reference)

    def compared(name: str, *keys: str) -> bool:
        return not holds_outputs or name in OUTPUT_ALIASES.values() or any(k in only for k in (name, *keys))

    pairs: list[Pairing] = []
    inputs = [key for name, key in [*reference.items(), *actual.items()] if set_aside(name)]
    not_outputs, missing = [], []
    for name, r_key in reference.items():
        if set_aside(name) or not selected(r_key, name, actual.get(name, r_key)):
            continue
        if not compared(name, r_key):
            not_outputs.append(r_key)
        elif name in actual:
            pairs.append(Pairing(actual[name], r_key, name))
        else:
            missing.append((name, r_key))
    extras = [key for name, key in actual.items()
              if name not in reference and not set_aside(name) and selected(key, name)]
    problems += [_missing(name, r_key, extras, key_map, shapes) for name, r_key in missing]
    # a map to an input name is for the input file (run's bundle, --inputs), not for these two sides
    unused_map = [f"{a}={r}" for a, r in key_map.items()
                  if a not in actual_keys and a not in reference_keys and not is_input_key(r)]
    if not pairs and not problems:
        problems.append(KeyProblem("empty", "", "nothing to compare: no keys selected"))
    return KeyMatch(tuple(pairs), tuple(problems), _not_compared_note(inputs, extras, not_outputs, unused_map))


def _missing(name: str, r_key: str, extras: Sequence[str], key_map: Mapping[str, str],
             shapes: Mapping[str, tuple[int, ...]] | None) -> KeyProblem:
    """A reference key actual lacks; with shapes, the actual key of its shape (and name) that may hold it."""
    message = f"{r_key}: in reference, missing from actual"
    if shapes is not None:
        key = suggest_key(name, {k: shapes.get(k) for k in extras if k not in key_map}, shapes.get(r_key))
        message += f"; --map {key}={name} reads {key} as it" if key is not None else ""
    return KeyProblem("missing", r_key, message)


def require_outputs(match: KeyMatch, judging: Judging, actual_shapes: Mapping[str, tuple[int, ...]],
                    expected: Mapping[str, tuple[int, ...]]) -> KeyMatch:
    """``match`` with every op output in judging.required (canonical names, those --only/--ignore select) that the
    kernel's keys (actual_shapes: key -> shape) do not give made "missing", whether or not the reference holds it:
    a kernel that stopped writing diff_gamma must not pass. Each such problem names the output, the kernel's key of
    its expected shape that may hold it (--map) and how to judge fewer (--only, the outputs the kernel gave)."""
    key_map, only, ignore = judging.key_map, set(judging.only), set(judging.ignore)
    given = {canonical_key(key, key_map) for key in actual_shapes}

    def selected(name: str) -> bool:
        names = {name} | {k for k, v in key_map.items() if v == name} | {k for k, v in OUTPUT_ALIASES.items() if v == name}
        return (not only or bool(names & only)) and not names & ignore

    lacking = [name for name in dict.fromkeys(judging.required) if name not in given and selected(name)]
    if not lacking:
        return match
    gave = [name for name in dict.fromkeys(OUTPUT_ALIASES.values()) if name in given and selected(name)]
    advice = f"; to judge only the outputs the kernel gave: --only {','.join(gave)}" if gave else ""
    others = {key: shape for key, shape in actual_shapes.items()
              if key not in key_map and canonical_key(key, key_map) not in OUTPUT_ALIASES.values() and not is_input_key(key)}

    def problem(name: str) -> KeyProblem:
        key = suggest_key(name, others, expected.get(name))
        suggestion = f"; --map {key}={name} reads {key} as it" if key is not None else ""
        return KeyProblem("missing", name, f"{name}: missing from actual, the kernel's outputs{suggestion}{advice}")

    kept = [p for p in match.problems  # the missing outputs say what there is to compare, each once
            if p.kind != "empty" and not (p.kind == "missing" and canonical_key(p.name, key_map) in lacking
                                          and not p.message.startswith("--"))]
    return KeyMatch(match.pairs, tuple(kept) + tuple(problem(name) for name in lacking), match.notes)


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


def structural_problem(name: str, actual: np.ndarray, reference: np.ndarray) -> KeyProblem | None:
    """A reason the pair cannot be compared (dtype, shape), or None."""
    for side, array in (("actual", actual), ("reference", reference)):
        if dtype_name(array.dtype) is None:
            return KeyProblem(
                "dtype", name, f"{name}: {side} has dtype {array.dtype}, which cannot be compared (expected f64, f32, f16 or bf16)"
            )
    if actual.shape != reference.shape:
        hint = permutation_hint(actual.shape, reference.shape)
        message = f"{name}: actual has shape {tuple(actual.shape)}, reference {tuple(reference.shape)}"
        return KeyProblem("shape", name, f"{message}; {hint}" if hint else message)
    return None
