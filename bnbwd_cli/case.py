"""A case: the op's inputs (and a kernel's outputs) from one set of named arrays, and its judgement.

One path for every command and the Python API: `run` and `verify --inputs` read their bundles
through `read_inputs`, `check` and `bnbwd_cli.check` judge through `judge`, which computes
bnbwd's outputs with core.backward and compares with judge.compare_sets. Pure: arrays in,
dataclasses out (read_inputs alone reads a file, through files/read.py); a problem with the input
is a BnbwdError (one line, exit 3 on the command line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli import core as compute_core
from bnbwd_cli.errors import BnbwdError
from bnbwd_cli.files.read import read_bundle, read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.judge.tolerance import Judging
from bnbwd_cli.spec import OUTPUT_NAMES, PROFILES, resolve_epsilon, input_keys, inputs_from_bundle, is_input_key, validate_inputs

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison
# The error model and the comparison are imported where used: `bnbwd run` reads its inputs through this
# module and, without --reference, never loads them (tests/test_startup.py).


@dataclass(frozen=True)
class Split:
    """A file's arrays sorted out: inputs by canonical name, attributes, the kernel's outputs (by the file's
    own keys, for the report) and the keys that are neither."""

    inputs: dict[str, np.ndarray]
    attributes: dict[str, object]
    outputs: dict[str, np.ndarray]
    unused: tuple[str, ...]

    def note(self) -> str | None:
        """One line naming the keys that were not used, or None."""
        return f"not used: {', '.join(self.unused)}" if self.unused else None


def wanted_keys(key_map: Mapping[str, str]) -> frozenset[str]:
    """The keys of a bundle that can hold an input or attribute, so that no other member is ever inflated."""
    mapped = {theirs for theirs, ours in key_map.items() if is_input_key(ours)}
    return (input_keys() - set(key_map)) | mapped


def split_arrays(arrays: Mapping[str, np.ndarray], key_map: Mapping[str, str], label: str) -> Split:
    """Sort a file's arrays by ``--map THEIRS=OURS``, then by canonical name or any spec's alias."""
    from bnbwd_cli.judge.keys import OUTPUT_ALIASES, canonical_key

    renamed: dict[str, np.ndarray] = {}
    seen_as: dict[str, str] = {}
    outputs: dict[str, np.ndarray] = {}
    unused: list[str] = []
    for key in arrays:  # by key: a member no rule uses is never read (arrays may be a files.read.LazyArrays)
        name = key_map.get(key, key)
        if is_input_key(name):
            if name in renamed:
                raise BnbwdError(f"{label}: both {seen_as[name]!r} and {key!r} give {name}; keep one")
            renamed[name], seen_as[name] = arrays[key], key
        elif canonical_key(key, key_map) in OUTPUT_ALIASES.values():
            outputs[key] = arrays[key]
        else:
            unused.append(key)
    inputs, attributes = inputs_from_bundle(renamed, label)
    return Split(inputs, attributes, outputs, tuple(unused))


def read_inputs(source: str, key_map: Mapping[str, str], what: str = "bundle", declared: bool = False) -> Split:
    """The inputs and attributes of a bundle (.npz path, pipe or '-'); members that can hold neither are
    never inflated (they may be a kernel's large outputs): they are only named in the Split's note.
    `declared`: large inputs come as files.npy.Declared stand-ins (checked by their headers, read after)."""
    keys: list[str] = []
    arrays = read_bundle(source, what, check_keys=keys.extend, only=wanted_keys(key_map), declared=declared)
    split = split_arrays(arrays, key_map, f"{what} (stdin)" if source == "-" else f"{what} ({source})")
    return replace(split, unused=tuple(key for key in keys if key not in arrays))


@dataclass(frozen=True)
class OpSettings:
    """How the op ran: epsilon and data_format None = the spec's default; names as in `bnbwd run`."""

    epsilon: float | None = None
    data_format: str | None = None
    spec: str = "generic"
    training: bool = True
    variance_is_invstd: bool = False


def build_inputs(inputs: Mapping[str, np.ndarray], op: OpSettings, label: str) -> compute_core.Op:
    """Check the inputs as `bnbwd run` does (names, shapes, dtypes, the spec's rules) and bundle them."""
    profile = PROFILES[op.spec]
    for name in ("src", "diff_dst", "mean", "variance", *profile.required):
        if name not in inputs:  # said here: run's message names run's flags, which a case file has not
            raise BnbwdError(f"{label}: missing input {name} (spec {profile.name}): no key {name!r} or a spec's "
                             f"name for it; --map THEIRS={name} reads your own")
    data_format = op.data_format or profile.default_format
    epsilon = resolve_epsilon(op.epsilon, profile, op.variance_is_invstd)
    if epsilon is None:
        raise BnbwdError(f"{label}: no epsilon: the file has no 'epsilon' entry; give --epsilon")
    checked = dict(inputs)
    try:
        canonical = validate_inputs(checked, profile, data_format, variance_is_invstd=op.variance_is_invstd,
                                    outputs=OUTPUT_NAMES)
    except BnbwdError as exc:
        raise BnbwdError(f"{label}: {exc.format_message()}") from None
    return compute_core.Op(checked["src"], checked["diff_dst"], checked["mean"], checked["variance"], checked.get("gamma"),
                          epsilon=epsilon, data_format=canonical, training=op.training,
                          variance_is_invstd=op.variance_is_invstd)


def reference_outputs(problem: compute_core.Op, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """bnbwd's outputs for these names (canonical), from the checked inputs."""
    result = compute_core.backward(problem, compute_core.Settings(outputs=names))
    return {name: getattr(result, name) for name in names}


def judge(problem: compute_core.Op, actual: Mapping[str, np.ndarray], judging: Judging) -> SetComparison:
    """Judge a kernel's outputs (keys: canonical, spec aliases or mapped) against bnbwd's, by the problem's
    own error scale: the judgement of `run --reference` and `verify --inputs`."""
    from bnbwd_cli.judge.keys import canonical_key
    from bnbwd_cli.judge.sets import compare_sets

    present = {canonical_key(key, judging.key_map) for key in actual}
    names = tuple(name for name in OUTPUT_NAMES if name in present)
    if not names:
        raise BnbwdError("no kernel outputs to judge: expected diff_src, diff_gamma or diff_beta "
                         "(or a spec's name for them, or --map THEIRS=OURS)")
    return compare_sets(actual, reference_outputs(problem, names), judging, inputs=problem)


@dataclass(frozen=True)
class CaseOutcome:
    """One case file's verdict: a comparison, or the one-line error that kept it from being judged."""

    path: str
    result: SetComparison | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """"pass", "mismatch", "structural" (an output that cannot be compared) or "error" (unreadable)."""
        return "error" if self.result is None else self.result.status

    @property
    def exit_code(self) -> int:
        return 3 if self.result is None else int(self.result.exit_code)


def judge_file(path: str, op: OpSettings, judging: Judging, bf16: tuple[str, ...] = ()) -> CaseOutcome:
    """Read one case (inputs and kernel outputs in one .npz or directory) and judge it. The file's own
    'epsilon' and 'data_format' entries win: `op` holds the defaults for files that do not say.
    bf16: keys (the file's own or canonical names) whose int16/uint16 bits are bfloat16."""
    try:
        arrays = read_tensor_set(path)
        found = reinterpret_bf16(bf16, {path: arrays})
        split = split_arrays(arrays, judging.key_map, path)
        found |= reinterpret_bf16([key for key in bf16 if key not in found], {path: split.inputs})
        check_found(bf16, found, path)
        attributes = split.attributes
        op = replace(op, epsilon=attributes.get("epsilon", op.epsilon),
                     data_format=attributes.get("data_format") or op.data_format)
        result = judge(build_inputs(split.inputs, op, path), split.outputs, judging)
    except BnbwdError as exc:
        message = exc.format_message()  # every error names the case, once
        return CaseOutcome(path, error=message if message.startswith(path) else f"{path}: {message}")
    return CaseOutcome(path, result, notes=(split.note(),) if split.note() else ())
