"""The op's inputs, gathered one way for every command and the Python API: named arrays and settings -> Op.

`run` and `verify --inputs` read their bundles through `read_inputs`, `check` sorts a case file's arrays
through `split_arrays`, the API hands its arrays over as they are; all of them end in `build_op`, so one
mistake (a missing input, no epsilon, a shape that does not fit) is one InputError with one message
everywhere. Pure but for read_inputs, which reads a bundle through files/read.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from bnbwd_cli.errors import InputError
from bnbwd_cli.files.read import read_bundle
from bnbwd_cli.op import Op
from bnbwd_cli.spec import OUTPUT_NAMES, PROFILES, input_keys, inputs_from_bundle, is_input_key, resolve_epsilon, validate_inputs


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
                raise InputError(f"{label}: both {seen_as[name]!r} and {key!r} give {name}; keep one")
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

    def filled_from(self, attributes: Mapping[str, object]) -> OpSettings:
        """A file's 'epsilon' and 'data_format' where these settings say nothing (run, verify: a flag wins)."""
        return replace(self, epsilon=self.epsilon if self.epsilon is not None else attributes.get("epsilon"),
                       data_format=self.data_format or attributes.get("data_format"))

    def overridden_by(self, attributes: Mapping[str, object]) -> OpSettings:
        """A file's 'epsilon' and 'data_format' over these settings (check: a case's own entries win)."""
        return replace(self, epsilon=attributes.get("epsilon", self.epsilon),
                       data_format=attributes.get("data_format") or self.data_format)

    @property
    def format_or_default(self) -> str:
        return self.data_format or PROFILES[self.spec].default_format


def build_op(inputs: Mapping[str, np.ndarray], op: OpSettings, outputs: tuple[str, ...] = OUTPUT_NAMES) -> Op:
    """Check the inputs (names, shapes, dtypes, the spec's rules, an epsilon) and bundle them: the one way
    from named arrays to an Op. src and diff_dst may be files.blocks.NpyBlocks (a streamed run)."""
    profile = PROFILES[op.spec]
    canonical = validate_inputs(dict(inputs), profile, op.format_or_default, variance_is_invstd=op.variance_is_invstd,
                                outputs=outputs)
    epsilon = resolve_epsilon(op.epsilon, profile, op.variance_is_invstd)
    if epsilon is None:
        raise InputError(f"no epsilon: spec {profile.name} has no default and the inputs hold no 'epsilon' entry",
                         hint="give --epsilon")
    return Op(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma"),
              epsilon=epsilon, data_format=canonical, training=op.training, variance_is_invstd=op.variance_is_invstd)
