"""Judge a kernel's outputs: against bnbwd's own, computed from the op's inputs (run --reference, check, the
API), or against a reference file's (verify: read_sets). The verdict is a judge.SetComparison; showing it is
the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    bf16: keys (in any of them) whose 2-byte integer data is bfloat16."""

    actual: str
    reference: str
    inputs_bundle: str | None = None
    op: OpSettings = OpSettings()
    naming: Naming = Naming()
    bf16: tuple[str, ...] = ()


def read_sets(files: FileSets, on_note: Callable[[str], None] | None = None) -> TensorSets:
    """Read both sets (and the inputs); on_note hears the bundle's keys that were not used, once."""
    actual = read_tensor_set(files.actual)
    reference = read_tensor_set(files.reference)
    found = reinterpret_bf16(files.bf16, {files.actual: actual, files.reference: reference})
    inputs = None
    if files.inputs_bundle is not None:
        label = f"--inputs ({files.inputs_bundle})"
        split = read_inputs(files.inputs_bundle, SplitRequest(files.naming, files.op), "--inputs")
        found |= reinterpret_bf16(files.bf16, {label: split.inputs})
        if split.note() and on_note is not None:
            on_note(f"{label}: {split.note()}")
        inputs = split.build_op()
    check_found(files.bf16, found, "ACTUAL, REFERENCE" + (" or --inputs" if files.inputs_bundle else ""))
    return TensorSets(actual, reference, files.actual, files.reference, inputs)


def compare(sets: TensorSets, judging: Judging, data_format: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> SetComparison:
    """Compare two tensor sets key by key; with sets.inputs, the op's outputs by the problem's error scale.
    progress: told (done, total) elements as the judging goes (a bar's callback, as app/run.py's)."""
    from bnbwd_cli.judge.sets import compare_sets

    if not judging.threads:
        judging = replace(judging, threads=usable_cores())
    return compare_sets(sets.actual, sets.reference, judging, data_format=data_format, inputs=sets.inputs,
                        progress=progress)


def reference_outputs(op: Op, names: tuple[str, ...], threads: int | None = None) -> dict[str, np.ndarray]:
    """bnbwd's outputs for these names (canonical), from the checked inputs (threads None: the machine's)."""
    from bnbwd_cli import core as compute_core  # here: `verify` without --inputs never loads the core

    result = compute_core.backward(op, compute_core.Settings(outputs=names, threads=threads))
    return {name: getattr(result, name) for name in names}


def judge_outputs(op: Op, actual: Mapping[str, np.ndarray], judging: Judging,
                  threads: int | None = None) -> SetComparison:
    """Judge a kernel's outputs (keys: canonical, spec aliases or mapped) against bnbwd's, by the problem's
    own error scale: the judgement of `run --reference`, `check` and the API. threads: the core's and the
    judging's (None: the machine's; check's worker processes use one each)."""
    from bnbwd_cli.judge.keys import canonical_key

    present = {canonical_key(key, judging.key_map) for key in actual}
    names = tuple(name for name in OUTPUT_NAMES if name in present)
    if not names:
        raise InputError("no kernel outputs to judge: expected diff_src, diff_gamma or diff_beta "
                         "(or a spec's name for them)", hint="--map THEIRS=OURS names your own")
    judging = replace(judging, threads=threads or judging.threads)  # (a Judging's own threads, unless given here)
    return compare(TensorSets(actual, reference_outputs(op, names, threads), inputs=op), judging)
