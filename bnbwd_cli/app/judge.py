"""Judge a kernel's outputs: judge_kernel, the one judgement of `run --reference`, `verify --inputs`, `check` and
the API (against bnbwd's outputs, computed from the op's inputs or read from verify's REFERENCE), or two plain
tensor sets key by key (`verify` without --inputs: compare). The verdict is a judge.SetComparison, decided
here; showing it is the caller's (nothing here prints).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bnbwd_cli.app.inputs import Naming, OpSettings, SplitRequest, read_inputs
from bnbwd_cli.errors import InputError
from bnbwd_cli.files.read import read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.op import Op
from bnbwd_cli.runtime import usable_cores
from bnbwd_cli.spec import OUTPUT_NAMES

if TYPE_CHECKING:
    from bnbwd_cli.judge.sets import SetComparison
    from bnbwd_cli.judge.tolerance import Judging
# The comparison (judge/sets.py and the error model) is imported where it is used: `bnbwd run` without
# --reference never loads it (tests/test_startup.py).


@dataclass(frozen=True)
class TensorSets:
    """What a comparison judges: the kernel's outputs (actual) and the reference, their names in the report,
    and the op's inputs when known (then the outputs are judged by the error model)."""

    actual: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    actual_label: str = "actual"
    reference_label: str = "reference"
    inputs: Op | None = None


@dataclass(frozen=True)
class FileSets:
    """verify's files: the kernel's outputs (actual), the reference and, when given, the op's inputs (a bundle,
    read as `bnbwd run` reads one: naming renames its keys, op's given settings win over its entries).
    bf16_keys: --bf16 KEY, keys (in any of them) whose 2-byte integer data is bfloat16."""

    actual: str
    reference: str
    inputs_bundle: str | None = None
    op: OpSettings = OpSettings()
    naming: Naming = Naming()
    bf16_keys: tuple[str, ...] = ()


def read_sets(files: FileSets, on_note: Callable[[str], None] | None = None) -> TensorSets:
    """Read both sets (and the inputs); on_note hears the bundle's keys that were not used, once."""
    actual = read_tensor_set(files.actual)
    reference = read_tensor_set(files.reference)
    found = reinterpret_bf16(files.bf16_keys, {files.actual: actual, files.reference: reference})
    inputs = None
    if files.inputs_bundle is not None:
        label = f"--inputs ({files.inputs_bundle})"
        split = read_inputs(files.inputs_bundle, SplitRequest(files.naming, files.op), "--inputs")
        found |= reinterpret_bf16(files.bf16_keys, {label: split.inputs})
        if split.note() and on_note is not None:
            on_note(f"{label}: {split.note()}")
        inputs = split.build_op()
    check_found(files.bf16_keys, found, "ACTUAL, REFERENCE" + (" or --inputs" if files.inputs_bundle else ""))
    return TensorSets(actual, reference, files.actual, files.reference, inputs)


def compare(sets: TensorSets, judging: Judging, data_format: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> SetComparison:
    """Compare two tensor sets key by key; with sets.inputs, the op's outputs by the problem's error scale.
    progress: told (done, total) elements as the judging goes (a bar's callback, as app/run.py's)."""
    from bnbwd_cli.judge.sets import compare_sets

    if judging.threads is None:
        judging = replace(judging, threads=usable_cores())
    return compare_sets(sets.actual, sets.reference, judging, data_format=data_format, inputs=sets.inputs,
                        progress=progress)


def reference_outputs(op: Op, names: tuple[str, ...], threads: int | None = None) -> dict[str, np.ndarray]:
    """bnbwd's outputs for these names (canonical), from the checked inputs (threads None: the machine's)."""
    from bnbwd_cli import core as compute_core  # here: `verify` without --inputs never loads the core

    result = compute_core.backward(op, compute_core.Settings(outputs=names, threads=threads))
    return {name: getattr(result, name) for name in names}


def judge_kernel(op: Op, kernel_outputs: Mapping[str, np.ndarray], judging: Judging, *,
                 required: Sequence[str] = OUTPUT_NAMES, reference: Mapping[str, np.ndarray] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> SetComparison:
    """The one judgement of a kernel: `run --reference`, `verify --inputs`, every `check` case and the API call it.

    kernel_outputs: the kernel's arrays by key (canonical, a spec's alias or renamed by judging.key_map); each
    element is judged by the problem's own error scale (op: the inputs the kernel saw). required: the outputs the
    kernel must give. Default every one, for every face: one the kernel lacks (of those --only/--ignore select) is
    a structural problem naming it and how to judge fewer (exit 3, a falsy Report), never a silent pass; run's
    --outputs and --no-param-grads narrow it. reference: bnbwd's outputs when known already (run computed them,
    verify read them), else computed here for the outputs the kernel gave. A kernel that gave none of the outputs
    is an InputError. Threads: judging.threads (None: the machine's), the core's and the judging's."""
    from bnbwd_cli.judge.keys import canonical_key

    given = {canonical_key(key, judging.key_map) for key in kernel_outputs}
    present = tuple(name for name in OUTPUT_NAMES if name in given)
    if not present:
        raise InputError("no kernel outputs to judge: expected diff_src, diff_gamma or diff_beta (or a spec's name "
                         "for them)", hint=_map_hint(op, kernel_outputs, judging.key_map))
    if reference is None:
        reference = reference_outputs(op, present, judging.threads)
    judging = replace(judging, required=tuple(required))
    result = compare(TensorSets(kernel_outputs, reference, inputs=op), judging, progress=progress)
    if judging.ftz and result.status == "mismatch":
        result = _inputs_read_as_zero(op, kernel_outputs, judging, present, result)
    return result


def _inputs_read_as_zero(op: Op, kernel_outputs: Mapping[str, np.ndarray], judging: Judging, present: tuple[str, ...],
                         result: SetComparison) -> SetComparison:
    """A failing run judged again against the op of its inputs with the subnormal ones read as zero (DAZ, a correct
    kernel built with fast math): that judgement when it passes (judge/daz.py), else ``result``. Only a failing
    run whose inputs hold a subnormal pays for it (a pass over the inputs, then one over the outputs)."""
    from bnbwd_cli.judge import daz

    flushed = daz.inputs_read_as_zero(op)
    if flushed is None:
        return result
    reference = reference_outputs(flushed, present, judging.threads or None)
    return daz.accepted(result, compare(TensorSets(kernel_outputs, reference, inputs=flushed), judging))


def _map_hint(op: Op, kernel_outputs: Mapping[str, np.ndarray], key_map: Mapping[str, str]) -> str:
    """--map KEY=OUTPUT for every output a kernel key fits by shape and name (each key once): the whole line in one
    error, else the general advice."""
    from bnbwd_cli.spec import suggest_key

    free = {key: tuple(np.shape(array)) for key, array in kernel_outputs.items() if key not in key_map}
    maps = {}
    for name in OUTPUT_NAMES:
        key = suggest_key(name, free, tuple(op.src.shape if name == "diff_src" else op.mean.shape))
        if key is not None:
            maps[key] = name
            del free[key]
    if not maps:
        return "--map THEIRS=OURS names your own"
    if len(maps) == 1:
        [(key, name)] = maps.items()
        return f"--map {key}={name} reads {key} as it"
    return " ".join(f"--map {key}={name}" for key, name in maps.items()) + " reads them (guessed by shape and name)"


def judge_sets(sets: TensorSets, judging: Judging, data_format: str | None = None) -> SetComparison:
    """verify's judgement: with the op's inputs, judge_kernel's (REFERENCE's arrays as bnbwd's outputs); without,
    the fixed tolerances key by key (compare)."""
    if sets.inputs is None:
        return compare(sets, judging, data_format)
    return judge_kernel(sets.inputs, sets.actual, judging, reference=sets.reference)
