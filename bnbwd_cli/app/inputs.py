"""The op's inputs, gathered one way for every command and the Python API: named arrays and settings -> Op.

`run` and `verify --inputs` read their bundles through `read_inputs`, `check` and the API sort their arrays
through `split_arrays` (names: canonical, any spec's, PyTorch's, --map's; PyTorch's statistics by the mode in
force; a file's epsilon, data_format and is_training entries); all of them end in `build_op`, so one mistake (a
missing input, no epsilon, a shape that does not fit) is one InputError with one message everywhere. Pure but
for read_inputs, which reads a bundle through files/read.py.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bnbwd_cli.errors import InputError
from bnbwd_cli.files.read import read_bundle, read_tensor_set
from bnbwd_cli.op import Op
from bnbwd_cli.layout import channel_axis, resolve_format
from bnbwd_cli.spec import (CHANNELS_FIRST_KEYS, MODE_STATISTICS, OUTPUT_NAMES, PROFILES, ShapesOnDemand, input_keys, inputs_from_bundle, is_input_key,
                            looks_like_gamma, read_attributes, resolve_epsilon, suggest_key, validate_inputs)


@dataclass(frozen=True)
class OpSettings:
    """How the op ran: epsilon and data_format None = the spec's default, training None = the file's entry or
    training; names as in `bnbwd run`."""

    epsilon: float | None = None
    data_format: str | None = None
    spec: str = "generic"
    training: bool | None = None
    variance_is_invstd: bool = False

    def filled_from(self, attributes: Mapping[str, object]) -> OpSettings:
        """A file's 'epsilon', 'data_format' and 'is_training' where these settings say nothing (run, verify: a
        flag wins)."""
        return replace(self, epsilon=self.epsilon if self.epsilon is not None else attributes.get("epsilon"),
                       data_format=self.data_format or attributes.get("data_format"),
                       training=self.training if self.training is not None else attributes.get("is_training"))

    def overridden_by(self, attributes: Mapping[str, object]) -> OpSettings:
        """A file's 'epsilon', 'data_format' and 'is_training' over these settings (check: a case's own entries win)."""
        return replace(self, epsilon=attributes.get("epsilon", self.epsilon),
                       data_format=attributes.get("data_format") or self.data_format,
                       training=attributes.get("is_training", self.training))

    @property
    def format_or_default(self) -> str:
        return self.data_format or PROFILES[self.spec].default_format

    @property
    def is_training(self) -> bool:
        return self.training is not False


@dataclass(frozen=True)
class Naming:
    """How a file's keys are read: key_map renames them (--map THEIRS=OURS); keys in ignore are left out on
    purpose (--ignore), so an unused key named like gamma is no error."""

    key_map: Mapping[str, str] = field(default_factory=dict)
    ignore: Collection[str] = ()


@dataclass(frozen=True)
class Split:
    """A file's arrays sorted out: inputs by canonical name, the settings in force (the caller's with the file's
    entries, PyTorch's save_invstd implying variance_is_invstd), the kernel's outputs (by the file's own keys,
    for the report) and the keys that are neither."""

    inputs: dict[str, np.ndarray]
    settings: OpSettings
    outputs: dict[str, np.ndarray]
    unused: tuple[str, ...]
    # the unused keys that are no kernel output (where a missing input may be), their shapes where read
    candidates: Mapping[str, tuple[int, ...] | None] = field(default_factory=dict)

    def note(self) -> str | None:
        """One line naming the keys that were not used, or None."""
        return f"not used: {', '.join(self.unused)}" if self.unused else None

    def output_guesses(self) -> dict[str, str]:
        """{ours: theirs}: the unused keys that most likely hold the kernel's outputs (by shape and name), once the
        missing inputs have taken theirs."""
        missing = [name for name in _required(self.settings) if name not in self.inputs]
        maps = _suggested_maps([*missing, *OUTPUT_NAMES], self.inputs, self.settings, self.candidates)
        return {name: key for name, key in maps.items() if name in OUTPUT_NAMES}

    def build_op(self, outputs: tuple[str, ...] = OUTPUT_NAMES, judged: bool = False) -> Op:
        """build_op on these inputs and settings; a missing input's error suggests an unused key by shape and name.
        judged: the file should also hold the kernel's outputs (check): holding none is part of the same error."""
        return build_op(self.inputs, self.settings, outputs, self.candidates,
                        OUTPUT_NAMES if judged and not self.outputs else ())


def wanted_keys(key_map: Mapping[str, str]) -> frozenset[str]:
    """The keys of a bundle that can hold an input or attribute, so that no other member is ever inflated."""
    mapped = {theirs for theirs, ours in key_map.items() if is_input_key(ours)}
    return (input_keys() - set(key_map)) | mapped


@dataclass(frozen=True)
class SplitRequest:
    """What sorting a file's arrays needs: the naming, the caller's settings and whether the file's entries win
    over them (check) or only fill what they leave open (run, verify)."""

    naming: Naming
    op: OpSettings
    file_wins: bool = False


def split_arrays(arrays: Mapping[str, np.ndarray], request: SplitRequest, label: str,
                 unread: Collection[str] = ()) -> Split:
    """Sort a file's arrays by ``--map THEIRS=OURS``, then by canonical name or any spec's alias (PyTorch's
    statistics by the mode in force). unread: the file's other keys, never inflated (named as unused)."""
    from bnbwd_cli.judge.keys import OUTPUT_ALIASES, canonical_key

    key_map = request.naming.key_map
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
    attributes = read_attributes(renamed, label)
    settings = request.op.overridden_by(attributes) if request.file_wins else request.op.filled_from(attributes)
    found = inputs_from_bundle(renamed, label, settings.is_training)
    settings = replace(settings, variance_is_invstd=settings.variance_is_invstd or found.variance_is_invstd)
    if settings.data_format is None and any(key in CHANNELS_FIRST_KEYS for key in seen_as.values()):
        settings = replace(settings, data_format="NCX")  # PyTorch's names: its tensors are logically channels-first
    unused += [seen_as[key] for key in found.other_mode] + [key for key in unread if key not in unused]
    _refuse_unused_gamma(unused, request.naming, label)
    candidates = ShapesOnDemand((arrays,), [key for key in unused if canonical_key(key, key_map) not in OUTPUT_ALIASES.values()])
    return Split(found.inputs, settings, outputs, tuple(unused), candidates)


def _refuse_unused_gamma(unused: Collection[str], naming: Naming, label: str) -> None:
    """An unused key named weight, scale or gamma would silently mean gamma = 1: an error, unless --ignore names it."""
    from bnbwd_cli.judge.keys import OUTPUT_ALIASES, canonical_key

    for key in unused:
        if looks_like_gamma(key) and key not in naming.ignore and canonical_key(key, naming.key_map) not in OUTPUT_ALIASES.values():
            target = naming.key_map.get(key)
            used_as = f"--map {key}={target} makes it {target}, not an input" if target else "it is not read"
            raise InputError(f"{label}: {key!r} looks like gamma but {used_as}; without gamma, gamma = 1 is assumed",
                             hint=f"--map {key}=gamma reads it as gamma, --ignore {key} leaves it out")


def read_inputs(source: str, request: SplitRequest, what: str = "bundle", declared: bool = False) -> Split:
    """The inputs and settings of a bundle (.npz path, pipe or '-'); members that can hold neither are never
    inflated (they may be a kernel's large outputs): they are only named in the Split's note.
    `declared`: large inputs come as files.npy.Declared stand-ins (checked by their headers, read after).
    A directory of .npy files (a PyTorch dump folder) is a bundle too, read as `check` reads one."""
    if source != "-" and Path(source).is_dir():
        return split_arrays(read_tensor_set(source), request, f"{what} ({source})")
    keys: list[str] = []
    arrays = read_bundle(source, what, check_keys=keys.extend, only=wanted_keys(request.naming.key_map),
                        declared=declared)
    return split_arrays(arrays, request, f"{what} (stdin)" if source == "-" else f"{what} ({source})",
                        unread=[key for key in keys if key not in arrays])


def build_op(inputs: Mapping[str, np.ndarray], op: OpSettings, outputs: tuple[str, ...] = OUTPUT_NAMES,
             others: Mapping[str, tuple[int, ...] | None] | None = None, outputs_missing: tuple[str, ...] = (),
             kernel_keys: Mapping[str, tuple[int, ...] | None] | None = None) -> Op:
    """Check the inputs (names, shapes, dtypes, the spec's rules, an epsilon) and bundle them: the one way
    from named arrays to an Op. src and diff_dst may be files.blocks.NpyBlocks (a streamed run). others: the
    file's unused keys and their shapes (None: unknown), for the missing input's suggested --map;
    outputs_missing: the kernel outputs a file that should hold them lacks (check; run --reference: the kernel's
    own file, whose keys are kernel_keys), named in the same error."""
    profile = PROFILES[op.spec]
    _check_present(inputs, op, others or {}, outputs_missing, kernel_keys)
    canonical = validate_inputs(dict(inputs), profile, op.format_or_default, variance_is_invstd=op.variance_is_invstd,
                                outputs=outputs)
    epsilon = resolve_epsilon(op.epsilon, profile, op.variance_is_invstd)
    if epsilon is None:
        raise InputError(f"no epsilon: spec {profile.name} has no default and the inputs hold no 'epsilon' entry",
                         hint="give --epsilon")
    return Op(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"], inputs.get("gamma"),
              epsilon=epsilon, data_format=canonical, training=op.is_training, variance_is_invstd=op.variance_is_invstd)


def _check_present(inputs: Mapping[str, np.ndarray], op: OpSettings, others: Mapping[str, tuple[int, ...] | None],
                   outputs_missing: tuple[str, ...] = (),
                   kernel_keys: Mapping[str, tuple[int, ...] | None] | None = None) -> None:
    """Every missing input (and, judging a file that should hold them, the outputs it lacks) in one error, with
    the --map THEIRS=OURS line that reads the unused keys most likely to hold them (by shape and name): the
    outputs' among kernel_keys when the kernel has a file of its own."""
    profile = PROFILES[op.spec]
    missing = [name for name in _required(op) if name not in inputs]
    if not missing and not outputs_missing:
        return
    message = f"missing input {missing[0]} (spec {profile.name}): no array named {missing[0]!r} or a spec's name for it" \
        if len(missing) == 1 else _missing_message(missing, (), profile.name) if missing else ""
    other_mode = {name: key for name in missing for key, n in MODE_STATISTICS[not op.is_training].items()
                  if n == name and key in others}
    if missing and len(other_mode) == len(missing) and not outputs_missing:
        mode, flag = ("inference", "--inference") if op.is_training else ("training", "no --inference")
        keys, maps = ", ".join(other_mode.values()), " ".join(f"--map {key}={name}" for name, key in other_mode.items())
        one = len(missing) == 1
        raise InputError(f"{message}; {keys} {'is' if one else 'are'} PyTorch's statistic{'' if one else 's'} for {mode}",
                         hint=f"{flag} if the kernel ran in {mode}, or {maps} to use {'it' if one else 'them'}")
    if kernel_keys is None:
        maps = _suggested_maps([*missing, *outputs_missing], inputs, op, others)
    else:
        maps = _suggested_maps(missing, inputs, op, others) | _suggested_maps(list(outputs_missing), inputs, op,
                                                                               kernel_keys)
    if len(missing) == 1 and not outputs_missing:
        key = maps.get(missing[0])
        if key is None:
            raise InputError(message, hint=f"--map THEIRS={missing[0]} reads your own name for it")
        shape = others[key]
        raise InputError(message, hint=f"--map {key}={missing[0]} reads {key}" + (f" {shape}" if shape is not None else "")
                         + " as it")
    raise InputError(_missing_message(missing, outputs_missing, profile.name), hint=_maps_hint(maps, [*missing, *outputs_missing]))


def _required(op: OpSettings) -> tuple[str, ...]:
    return ("src", "diff_dst", "mean", "variance", *PROFILES[op.spec].required)


def missing_inputs(inputs: Collection[str], op: OpSettings) -> list[str]:
    """The inputs the op needs (by the spec) that are not among these names."""
    return [name for name in _required(op) if name not in inputs]


def kernel_candidates(kernel: Mapping[str, np.ndarray], naming: Naming,
                      wanted: tuple[str, ...]) -> tuple[tuple[str, ...], Mapping[str, tuple[int, ...] | None]]:
    """A kernel's file read beside the inputs (run --reference): the outputs it lacks when it gives none of the
    wanted ones (named in a missing input's error, as check names a case's), and its keys with their shapes (where
    their --map is guessed); nothing when it gives some (judge_kernel says which it lacks)."""
    from bnbwd_cli.judge.keys import canonical_key

    if any(canonical_key(key, naming.key_map) in wanted for key in kernel):
        return (), {}
    return wanted, ShapesOnDemand((kernel,), [key for key in kernel if key not in naming.ignore])


def _missing_message(missing: list[str], outputs_missing: tuple[str, ...], spec: str) -> str:
    parts = [f"input{'s' if len(missing) > 1 else ''} {', '.join(missing)}"] if missing else []
    parts += [f"the kernel's outputs ({', '.join(outputs_missing)})"] if outputs_missing else []
    if not missing:
        return f"no kernel outputs to judge: expected {', '.join(outputs_missing[:-1])} or {outputs_missing[-1]} " \
               "(or a spec's name for them)"
    return f"missing {' and '.join(parts)} (spec {spec}): no arrays by these names or a spec's names for them"


def _maps_hint(maps: Mapping[str, str], names: list[str]) -> str:
    """The whole --map line for the names it could guess; the others named with --map THEIRS=NAME."""
    line = " ".join(f"--map {theirs}={ours}" for ours, theirs in maps.items())
    unguessed = [name for name in names if name not in maps]
    rest = f"--map THEIRS={unguessed[0]}" + (f" (and for {', '.join(unguessed[1:])})" if len(unguessed) > 1 else "") \
        + " reads your own name" if unguessed else ""
    if line and rest:
        return f"{line} reads them by shape and name; {rest} for the rest"
    return f"{line} reads them (guessed by shape and name)" if line else rest


def _suggested_maps(names: list[str], inputs: Mapping[str, np.ndarray], op: OpSettings,
                    others: Mapping[str, tuple[int, ...] | None]) -> dict[str, str]:
    """{ours: theirs}: for each name in turn, the unused key most likely to hold it (spec.suggest_key), each key
    used once."""
    free = {key: others[key] for key in others}
    maps = {}
    for name in names:
        key = suggest_key(name, free, _expected_shape(name, inputs, op))
        if key is not None:
            maps[name] = key
            del free[key]
    return maps


def _expected_shape(name: str, inputs: Mapping[str, np.ndarray], op: OpSettings) -> tuple[int, ...] | None:
    """The shape a missing input must have, from the inputs present (None when they do not say)."""
    src = inputs.get("src", inputs.get("diff_dst"))
    if src is None:
        return None
    if name in ("src", "diff_dst", "diff_src"):
        return tuple(src.shape)
    try:
        return (src.shape[channel_axis(resolve_format(op.format_or_default, src.ndim), src.ndim)],)
    except (InputError, ValueError, IndexError):
        return None
