"""One backward pass from files: gather the inputs, call the core once (in memory or streamed), write the outputs.

prepare() reads the bundle and the inputs given one by one and checks them into an Op (app/inputs.py);
compute() runs the core and writes every output through files/write.py, all or nothing; facts() is what
the run shows. Progress goes through the callback the caller passes; nothing here prints.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from bnbwd_cli import core as compute_core
from bnbwd_cli.app import streaming
from bnbwd_cli.app.inputs import (Naming, OpSettings, SplitRequest, build_op, kernel_candidates, missing_inputs,
                                  read_inputs)
from bnbwd_cli.core.summary import OutputStats
from bnbwd_cli.core.summary import scan as output_stats
from bnbwd_cli.files import blocks as files_blocks
from bnbwd_cli.files import write as files_write
from bnbwd_cli.files.npy import read_declared
from bnbwd_cli.files.read import declared_array, read_array, read_tensor_set
from bnbwd_cli.files.reinterpret import check_found, reinterpret_bf16
from bnbwd_cli.op import Op
from bnbwd_cli.render.run import RunFacts
from bnbwd_cli.spec import INPUT_NAMES, PROFILES

Progress = Callable[[int, int], None]  # (elements done, elements in all)


@dataclass(frozen=True)
class Destination:
    """Where the outputs go: one .npz (output; "-" is stdout) or a directory of .npy files, and whether to fsync."""

    output: str | None = None
    out_dir: Path | None = None
    fsync: bool = False

    @property
    def is_file(self) -> bool:
        return self.out_dir is not None or (self.output is not None and self.output != "-")


@dataclass(frozen=True)
class Compute:
    """How to run, never what comes out: the core's settings, and stream (None: decided from the inputs)."""

    threads: int | None = None
    block_bytes: int | None = None  # the core's tile budget (--block-size), None: the machine's caches
    core: str = "auto"
    stream: bool | None = None


@dataclass(frozen=True)
class RunRequest:
    """A run: inputs from a bundle and/or one by one (sources: canonical name -> PATH), the op's settings (given
    ones win over the bundle's entries), the outputs wanted and where they go.

    naming: how the bundle's keys are read (--map, --ignore); bf16_keys: --bf16 KEY, keys whose 2-byte integer data
    is bfloat16 (the inputs' here, the kernel's under --reference); keep_outputs: a streamed diff_src is read back (a judgement needs it), else a shape-only stand-in."""

    bundle: str | None
    sources: dict[str, str]
    op: OpSettings
    outputs: tuple[str, ...]
    destination: Destination
    compute: Compute = Compute()
    naming: Naming = Naming()
    bf16_keys: tuple[str, ...] = ()
    keep_outputs: bool = False
    kernel: str | None = None  # --reference KERNEL_OUT: a missing input's error also names the outputs it lacks


@dataclass(frozen=True)
class Prepared:
    """The op as read and checked: inputs by name (streamed src/diff_dst as NpyBlocks) and the Op over them."""

    inputs: dict
    op: Op
    data_format: str  # as given (e.g. NHWC)
    stream: bool
    note: str | None  # the bundle's keys that were not used, in one line


@dataclass(frozen=True)
class Computed:
    arrays: dict[str, np.ndarray]
    stats: dict[str, OutputStats]
    core: str
    elapsed_s: float


def prepare(request: RunRequest, stack: contextlib.ExitStack) -> Prepared:
    """Read the bundle and the inputs given one by one (streamed ones as blocks, closed with `stack`), check them."""
    split = read_inputs(request.bundle, SplitRequest(request.naming, request.op), declared=True) if request.bundle else None
    inputs, settings = (split.inputs, split.settings) if split else ({}, request.op)
    note = f"bundle ({request.bundle}): {split.note()}" if split and split.note() else None
    data_format = settings.format_or_default
    stream = _should_stream(request, data_format)
    for name, source in request.sources.items():
        blocks = files_blocks.open_npy_blocks(source, name) if stream and name in ("src", "diff_dst") else None
        if blocks is not None:
            stack.callback(blocks.close)
        inputs[name] = blocks if blocks is not None else declared_array(source, name)
    bf16_names = [key for key in request.bf16_keys if key in INPUT_NAMES]
    check_found(bf16_names, reinterpret_bf16(bf16_names, {"the inputs": inputs}), "the inputs")
    read_declared(inputs, keep=("src", "diff_dst"))  # large src/diff_dst: checked by their headers before a read
    outputs_missing, kernel_keys = (), None
    if request.kernel is not None and missing_inputs(inputs, settings):  # one error names every missing name
        outputs_missing, kernel_keys = kernel_candidates(read_tensor_set(request.kernel), request.naming,
                                                         request.outputs)
    op = build_op(inputs, settings, request.outputs, split.candidates if split else {}, outputs_missing, kernel_keys)
    if read_declared(inputs):
        op = build_op(inputs, settings, request.outputs)
    if PROFILES[settings.spec].paired_param_grads and "diff_gamma" not in request.outputs:
        inputs.pop("gamma", None)  # oneDNN Graph: without diff_gamma/diff_beta, gamma is ignored
        op = replace(op, gamma=None)
    return Prepared(inputs, op, data_format, stream, note)


def _should_stream(request: RunRequest, data_format: str) -> bool:
    """--stream as given, else: large .npy inputs stream by themselves (unless their blocks would be short runs).
    With --core numba only those too large to load safely do, and then the refusal says why."""
    if request.compute.stream is not None:
        return request.compute.stream
    return request.destination.is_file and streaming.should_stream(request.sources, data_format,
                                                                    memory_only=request.compute.core == "numba")


def compute(request: RunRequest, prepared: Prepared, progress: Progress | None = None) -> Computed:
    """Run the backward pass once (in memory, or streamed through the output file) and write the outputs."""
    started = time.perf_counter()
    if prepared.stream:
        arrays, stats, ran = _run_streamed(request, prepared, progress)
    else:
        settings = request.compute
        result = compute_core.backward(prepared.op, compute_core.Settings(
            outputs=request.outputs, block_bytes=settings.block_bytes, threads=settings.threads, progress=progress,
            core=settings.core))
        arrays, ran = {name: getattr(result, name) for name in request.outputs}, result.core
        stats = {name: result.stats[name] for name in request.outputs if name in result.stats}  # from the write pass
    elapsed = time.perf_counter() - started
    if not prepared.stream:
        _write_outputs(arrays, request.destination)
    # Outputs the core made come with their stats; the others (a streamed run's sums) are scanned here.
    stats = {**stats, **{name: output_stats(array) for name, array in arrays.items() if name not in stats}}
    return Computed(arrays, stats, ran, elapsed)


def facts(request: RunRequest, prepared: Prepared, computed: Computed, written: list[str]) -> RunFacts:
    op = prepared.op
    return RunFacts(spec=request.op.spec, data_format=prepared.data_format.upper(), canonical_format=op.data_format,
                    epsilon=None if op.variance_is_invstd else op.epsilon, training=op.training,
                    inputs=prepared.inputs, outputs=computed.arrays, written=written, elapsed_s=computed.elapsed_s,
                    core=computed.core, stream=prepared.stream, stats=computed.stats)


def kernel_under_test(request: RunRequest, prepared: Prepared, kernel_path: str) -> tuple[Op, dict]:
    """--reference: the op with its inputs whole (streamed src and diff_dst are read here: every element's error
    scale needs them) and the kernel's outputs read from kernel_path (bf16 keys that are not inputs are its keys)."""
    whole = {name: read_array(request.sources[name], name) for name in ("src", "diff_dst")
             if isinstance(getattr(prepared.op, name), files_blocks.NpyBlocks)}
    kernel = read_tensor_set(kernel_path)
    bf16_outputs = [key for key in request.bf16_keys if key not in INPUT_NAMES]
    check_found(bf16_outputs, reinterpret_bf16(bf16_outputs, {kernel_path: kernel}), kernel_path)
    return replace(prepared.op, **whole), kernel


def _write_outputs(arrays: dict[str, np.ndarray], destination: Destination) -> None:
    """In-memory outputs: an .npz (a file, a FIFO or device, or stdout) or a directory of .npy files."""
    if destination.output == "-":
        files_write.write_stdout(files_write.npz_bytes(arrays))
    elif destination.output is not None:
        files_write.write_npz(Path(destination.output), arrays, fsync=destination.fsync)
    elif destination.out_dir is not None:
        files_write.write_npy_dir(destination.out_dir, arrays, fsync=destination.fsync)


def _run_streamed(request: RunRequest, prepared: Prepared, progress: Progress | None) -> tuple[dict, dict, str]:
    """--stream: diff_src written by blocks into a temp file, committed with the other outputs, all or nothing.

    Returns (outputs, stats of the streamed ones, core that ran); a streamed diff_src is a shape-only stand-in
    unless keep_outputs (then it is read back).
    """
    import tempfile  # only here: it costs start-up time that `run` without --stream need not pay

    op, settings, outputs = prepared.op, request.compute, request.outputs
    src = op.src
    core_settings = compute_core.Settings(outputs=outputs, block_bytes=settings.block_bytes, threads=settings.threads,
                                          progress=progress, core=settings.core)
    out_dir, fsync = request.destination.out_dir, request.destination.fsync
    with contextlib.ExitStack() as stack:
        if out_dir is not None:
            outset = stack.enter_context(files_write.OutputSet(fsync=fsync))
            staged_path = out_dir / "diff_src.npy"
        else:
            outset = stack.enter_context(files_write.staging())
            destination = Path(request.destination.output)
            directory = Path(tempfile.gettempdir()) if files_write.is_write_through(destination) else destination.parent
            staged_path = directory / f"{destination.name}.diff_src.npy"
        writer = outset.new_npy(staged_path, src.shape, src.dtype) if "diff_src" in outputs else None
        result = streaming.run_streamed(op, core_settings, writer)
        arrays = {name: getattr(result, name) for name in outputs if name != "diff_src"}
        stats = {}
        if writer is not None:
            diff_src = writer.read_all() if request.keep_outputs else np.broadcast_to(np.zeros((), src.dtype), src.shape)
            arrays = {"diff_src": diff_src, **arrays}
            stats["diff_src"] = result.diff_src_stats
        if out_dir is not None:
            files_write.write_npy_dir(out_dir, {k: v for k, v in arrays.items() if k != "diff_src"}, outputs=outset)
        else:
            files_write.write_npz_with_streamed(destination, arrays, {"diff_src": writer} if writer else {}, fsync=fsync)
    return arrays, stats, result.core
